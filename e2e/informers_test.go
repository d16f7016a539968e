package e2e

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/heaptest"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testutil/testobjects"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/trim"
)

// BenchmarkInformerSync measures, on the real API server, what a replica
// that starts its informers only once it leads (--standby-informers=on-lead)
// adds to a failover: the LIST and sync of every pod, in protobuf with the
// trim transform (what the binary does) and in JSON without it (what it
// did), and the heap each cache holds. Pods are realistic (managed fields,
// last-applied, env, probes) and never scheduled. E2E_INFORMER_PODS sets
// how many (default 3,000); figures are also scaled to 200,000 pods.
func BenchmarkInformerSync(b *testing.B) {
	if theSuite == nil {
		b.Skip("no control plane (see TestMain)")
	}
	n := 3000
	if v := os.Getenv("E2E_INFORMER_PODS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("E2E_INFORMER_PODS=%q: want a positive number", v)
		}
	}
	ctx := context.Background()
	cp := theSuite.cp
	ns, err := cp.NewNamespace(ctx, "e2e-informers")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cp.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	writer := clientFor(b, cp.RESTConfig, "application/vnd.kubernetes.protobuf", 1000)
	created := time.Now()
	createPods(b, writer, ns, n)
	b.Logf("created %d pods in %s", n, time.Since(created).Round(time.Millisecond))

	tests := []struct {
		name        string
		contentType string
		transform   cache.TransformFunc
	}{
		{"protobuf-trimmed", "application/vnd.kubernetes.protobuf", trim.Object},
		{"protobuf-untrimmed", "application/vnd.kubernetes.protobuf", nil},
		{"json-untrimmed", "application/json", nil},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			var syncSec, heapPerPod float64
			for range b.N {
				syncSec, heapPerPod = syncPods(b, clientFor(b, cp.RESTConfig, tt.contentType, 1000), ns, n, tt.transform)
			}
			b.ReportMetric(syncSec*1000/float64(n)*1000, "ms-per-1000-pods")
			b.ReportMetric(syncSec/float64(n)*200000, "s-sync-at-200k-pods")
			b.ReportMetric(heapPerPod, "B/pod-cached")
			b.ReportMetric(heapPerPod*200000/(1<<20), "MiB-cached-at-200k-pods")
		})
	}
}

func clientFor(b *testing.B, base *rest.Config, contentType string, qps float32) kubernetes.Interface {
	b.Helper()
	cfg := rest.CopyConfig(base)
	cfg.ContentType, cfg.AcceptContentTypes = contentType, contentType
	cfg.QPS, cfg.Burst = qps, int(qps)
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// createPods creates n realistic pods no scheduler takes, 16 at a time.
func createPods(b *testing.B, c kubernetes.Interface, ns string, n int) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				p := to.RealisticPod(i)
				p.Namespace, p.ResourceVersion, p.UID, p.ManagedFields = ns, "", "", nil
				p.OwnerReferences, p.Spec.NodeName, p.Spec.SchedulerName = nil, "", "none"
				p.Spec.ServiceAccountName, p.Status = "", apiv1.PodStatus{}
				p.Spec.Volumes = p.Spec.Volumes[:1] // the token volume is the API server's to add
				for k := range p.Spec.Containers {
					p.Spec.Containers[k].VolumeMounts = p.Spec.Containers[k].VolumeMounts[:1]
				}
				if _, err := c.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					select {
					case errs <- fmt.Errorf("creating pod %d: %w", i, err):
					default:
					}
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// syncPods starts a pod informer on ns, waits until it holds n pods, and
// returns the seconds it took and the heap its cache holds per pod.
func syncPods(b *testing.B, c kubernetes.Interface, ns string, n int, transform cache.TransformFunc) (float64, float64) {
	b.Helper()
	before := heaptest.Live()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := []informers.SharedInformerOption{informers.WithNamespace(ns)}
	if transform != nil {
		opts = append(opts, informers.WithTransform(transform))
	}
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, opts...)
	inf := f.Core().V1().Pods().Informer()
	start := time.Now()
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("pod informer did not sync")
	}
	took := time.Since(start).Seconds()
	if got := len(inf.GetStore().ListKeys()); got != n {
		b.Fatalf("informer holds %d pods, want %d", got, n)
	}
	after := heaptest.Live()
	runtime.KeepAlive(inf)
	cancel()
	f.Shutdown()
	return took, float64(after-before) / float64(n)
}
