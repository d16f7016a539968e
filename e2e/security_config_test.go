package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The flags ConfigMap may not choose where the Azure credential goes, nor
// turn leader election off: an edit naming azure-arm-endpoint and
// leader-elect: false (with a live key beside them) is refused whole, with
// a ConfigRejected event naming both keys; nothing of it applies,
// nothing waits for a restart, the last good configuration stays. When
// the kubelet refreshes the mounted --config file with that edit and the
// autoscaler restarts, it refuses the file too and runs on the last good
// configuration, scaling through the endpoint of its command line.
func TestSecurityIdentityFlagsRefusedLive(t *testing.T) {
	t.Parallel()
	sc := newScenario(t)
	sc.failover = true // killed and restarted: the new one takes the lease within 4 s
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	const flags = "node-addition-rate: 6\nnode-addition-burst: 1\nnode-addition-adaptive: false\n"
	cms := sc.s.cp.Client.CoreV1().ConfigMaps(sc.ns)
	cm := &apiv1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "vmss-autoscaler-config"}, Data: map[string]string{"config.yaml": flags}}
	_, err := cms.Create(sc.ctx, cm, metav1.CreateOptions{})
	must(t, err)
	file := filepath.Join(t.TempDir(), "config.yaml") // the kubelet's copy
	must(t, os.WriteFile(file, []byte(flags), 0o600))
	args := []string{"--nodes=0:20:" + cpu, "--config=" + file, "--config-map=" + cm.Name}
	as := sc.autoscaler("autoscaler", args...)
	sc.workload("web", 2, "9", 0, cpu)
	lastGood := func() string {
		st, err := cms.Get(sc.ctx, "vmss-autoscaler-status", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return st.Data["lastGoodConfig"]
	}
	sc.eventually("the first node, and the flags stored as the last good", time.Minute, func() (bool, string) {
		c, lg := sc.capacity(cpu), lastGood()
		return c >= 1 && lg == flags, fmt.Sprintf("capacity %d, lastGoodConfig %q", c, lg)
	})

	// An edit that also turns leader election off: read again as --config
	// at a restart, it made a replica lead beside the other, unfenced.
	edit := strings.Replace(flags, "node-addition-rate: 6", "node-addition-rate: 600", 1) + "azure-arm-endpoint: https://attacker.invalid\nleader-elect: false\n"
	cur, err := cms.Get(sc.ctx, cm.Name, metav1.GetOptions{})
	must(t, err)
	cur.Data["config.yaml"] = edit
	_, err = cms.Update(sc.ctx, cur, metav1.UpdateOptions{})
	must(t, err)
	const why = "--azure-arm-endpoint: may be set on the command line only (it decides where the Azure credential is sent)"
	const whyLeader = "--leader-elect: may be set on the command line only (it decides whether a replica acts without holding the Lease"
	sc.eventually("the edit refused with an event naming the keys", 30*time.Second, func() (bool, string) {
		n := 0
		for _, e := range sc.events("ConfigRejected") {
			if strings.Contains(e.Message, why) && strings.Contains(e.Message, whyLeader) {
				n++
			}
		}
		return n > 0, fmt.Sprintf("%d events %v", n, sc.events("ConfigRejected"))
	})
	_, body := sc.get(as, "/metrics")
	if got := metricValue(body, `vmss_autoscaler_config_reloads_total{result="rejected"}`); got != 1 {
		t.Fatalf("rejected reloads %v, want 1", got)
	}
	if got := metricValue(body, "vmss_autoscaler_node_addition_rate_nodes_per_minute"); got != 6 {
		t.Fatalf("rate %v after the refused edit, want 6: its live key must not apply either", got)
	}
	if got := metricValue(body, "vmss_autoscaler_config_restart_required"); got > 0 {
		t.Fatalf("config_restart_required %v: the key was taken as waiting for a restart", got)
	}
	if n := len(sc.events("ConfigRestartRequired")) + len(sc.events("ConfigApplied")); n > 0 {
		t.Fatalf("%d ConfigRestartRequired or ConfigApplied events: the edit was accepted", n)
	}
	if lg := lastGood(); lg != flags {
		t.Fatalf("lastGoodConfig %q after the refused edit, want %q", lg, flags)
	}

	// The kubelet refreshes the mounted file with the refused edit; the
	// autoscaler restarts (a rollout, a node drain) and refuses it too.
	must(t, os.WriteFile(file, []byte(edit), 0o600))
	must(t, as.Kill())
	<-as.Exited()
	again := sc.autoscaler("restarted", args...)
	sc.eventually("the restart on the last good configuration, said with the key", time.Minute, func() (bool, string) {
		n := 0
		for _, e := range sc.events("ConfigFallback") {
			if strings.Contains(e.Message, why) && strings.Contains(e.Message, "running on the last good configuration") {
				n++
			}
		}
		return n > 0, fmt.Sprintf("ConfigFallback events %v", sc.events("ConfigFallback"))
	})
	sc.eventually("the restarted autoscaler leading at the last good rate", time.Minute, func() (bool, string) {
		_, body := sc.get(again, "/metrics")
		fb, rate := metricValue(body, "vmss_autoscaler_config_fallback"), metricValue(body, "vmss_autoscaler_node_addition_rate_nodes_per_minute")
		return fb == 1 && rate == 6, fmt.Sprintf("config_fallback %v, rate %v", fb, rate)
	})
	// It still reaches ARM where its command line says.
	sc.scaleDeployment("web", 4)
	sc.eventually("4 pods Running after the restart", 2*time.Minute, allRunning(sc, 4))
	if hasExited(again) {
		t.Fatalf("the restarted autoscaler exited: see %s", again.LogFile)
	}
}
