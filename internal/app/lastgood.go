package app

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	apiv1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
)

// lastGoodKey is the key of the status ConfigMap holding the flags
// ConfigMap's last accepted content: where a restart finds it.
const lastGoodKey = "lastGoodConfig"

// lastGoodTimeout bounds a read or a write of the last good configuration.
const lastGoodTimeout = 30 * time.Second

// startConfig parses the configuration at start. Only a bad command line
// stops the binary. A refused --config file (the flags ConfigMap, mounted
// by the chart: a bad edit stays in it and would crash-loop every replica)
// falls back to the last configuration the autoscaler accepted, stored in
// its status ConfigMap, or to the command line alone; fallback says which,
// and why.
func startConfig(ctx context.Context, args []string, extra func(*pflag.FlagSet),
	lastGood func(context.Context, *config) (string, error)) (*config, *pflag.FlagSet, string, error) {
	c, fs, err := parseConfigFrom(args, extra, nil, "")
	if err == nil {
		return c, fs, "", nil
	}
	fileErr := err
	// The command line alone (an empty YAML map instead of the file).
	cl, clfs, err := parseConfigFrom(args, extra, []byte("{}"), "the command line")
	if err != nil {
		return nil, nil, "", err
	}
	if cl.configFile == "" {
		return nil, nil, "", fileErr
	}
	data, err := lastGood(ctx, cl)
	switch {
	case err != nil:
		return cl, clfs, fmt.Sprintf("%v; the last good configuration could not be read (%v): running on the command line alone", fileErr, err), nil
	case data == "":
		return cl, clfs, fmt.Sprintf("%v; no last good configuration stored: running on the command line alone", fileErr), nil
	}
	src := fmt.Sprintf("the last good configuration (ConfigMap %s/%s key %s)", cl.core.Namespace, cl.core.StatusConfigMapName, lastGoodKey)
	lg, lgfs, err := parseConfigFrom(args, extra, []byte(data), src)
	if err != nil {
		// Parse the command line again: the flags' bound values must be
		// the configuration in force.
		cl, clfs, _ = parseConfigFrom(args, extra, []byte("{}"), "the command line")
		return cl, clfs, fmt.Sprintf("%v; %s refused too (%v): running on the command line alone", fileErr, src, err), nil
	}
	return lg, lgfs, fmt.Sprintf("%v: running on %s", fileErr, src), nil
}

// readLastGood reads the last good flags content from the status ConfigMap.
func readLastGood(ctx context.Context, c *config) (string, error) {
	restCfg, err := kubeConfig(c.kubeconfig)
	if err != nil {
		return "", err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return "", fmt.Errorf("building Kubernetes client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, lastGoodTimeout)
	defer cancel()
	cm, err := client.CoreV1().ConfigMaps(c.core.Namespace).Get(ctx, c.core.StatusConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading ConfigMap %s/%s: %w", c.core.Namespace, c.core.StatusConfigMapName, err)
	}
	return cm.Data[lastGoodKey], nil
}

// lastGoodStore writes the last good flags content into the status
// ConfigMap, which the leader's loop also writes (its status key).
type lastGoodStore struct {
	client    corev1client.ConfigMapsGetter
	namespace string
	name      string
}

// save stores data under lastGoodKey, leaving the other keys as they are,
// and creates the ConfigMap if there is none. A write that lost a race
// with the loop's status write (a conflict, or a create after the status
// created the ConfigMap) reads the ConfigMap again and retries.
func (s lastGoodStore) save(ctx context.Context, data string) error {
	ctx, cancel := context.WithTimeout(ctx, lastGoodTimeout)
	defer cancel()
	raced := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	if err := retry.OnError(retry.DefaultRetry, raced, func() error { return s.write(ctx, data) }); err != nil {
		return fmt.Errorf("storing the last good configuration in ConfigMap %s/%s key %s: %w", s.namespace, s.name, lastGoodKey, err)
	}
	return nil
}

// write is one attempt of save: a Get, then a Create or an Update.
func (s lastGoodStore) write(ctx context.Context, data string) error {
	cms := s.client.ConfigMaps(s.namespace)
	cm, err := cms.Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &apiv1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "vmss-autoscaler"}},
			Data: map[string]string{lastGoodKey: data},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if v, ok := cm.Data[lastGoodKey]; ok && v == data {
		return nil
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[lastGoodKey] = data
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	return err
}
