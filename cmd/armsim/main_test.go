package main

import (
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// parse parses args as main does and returns the configuration.
func parse(t *testing.T, args ...string) *config {
	t.Helper()
	fs := pflag.NewFlagSet("armsim", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := bindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("Parse(%v): %v", args, err)
	}
	cfg.complete(fs)
	return cfg
}

func TestRealismFlags(t *testing.T) {
	cilium := v1.Taint{Key: "node.cilium.io/agent-not-ready", Value: "true", Effect: v1.TaintEffectNoSchedule}
	withCilium := armsim.DefaultRealism()
	withCilium.StartupTaints = []v1.Taint{cilium}
	legacyExact := armsim.Exact()
	legacyExact.Reservation = armsim.ReservationAKSLegacy
	legacyExact.StartupTaintDelay = armsim.DefaultStartupTaintDelay
	exact := armsim.Exact()
	exact.StartupTaintDelay = armsim.DefaultStartupTaintDelay // harmless without startup taints
	custom := armsim.Realism{
		Reservation: armsim.ReservationAKS, MaxPods: 30, EphemeralStorage: resource.MustParse("50Gi"),
		DevicePluginDelay: time.Minute, StartupTaintDelay: armsim.DefaultStartupTaintDelay,
	}
	tests := []struct {
		name       string
		args       []string
		want       armsim.Realism
		wantJitter time.Duration
	}{
		{"defaults: as AKS registers nodes", nil, armsim.DefaultRealism(), defaultBootJitter},
		{"startup taint", []string{"--startup-taint=node.cilium.io/agent-not-ready=true:NoSchedule"}, withCilium, defaultBootJitter},
		{"exact", []string{"--exact"}, exact, 0},
		{"exact with one knob", []string{"--exact", "--reservation=aks-legacy"}, legacyExact, 0},
		{"knobs", []string{"--max-pods=30", "--ephemeral-storage=50Gi", "--provider-ids=arm", "--device-plugin-delay=1m", "--boot-jitter=5s"}, custom, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := parse(t, tt.args...)
			got, err := cfg.realism()
			if err != nil {
				t.Fatalf("realism: %v", err)
			}
			if got.EphemeralStorage.Cmp(tt.want.EphemeralStorage) != 0 {
				t.Errorf("ephemeral storage %s, want %s", got.EphemeralStorage.String(), tt.want.EphemeralStorage.String())
			}
			got.EphemeralStorage, tt.want.EphemeralStorage = resource.Quantity{}, resource.Quantity{}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("realism\n got %+v\nwant %+v", got, tt.want)
			}
			if cfg.bootJitter != tt.wantJitter {
				t.Errorf("boot jitter %v, want %v", cfg.bootJitter, tt.wantJitter)
			}
		})
	}
}

func TestRealismFlagErrors(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string // the flag and its value
	}{
		{[]string{"--reservation=gke"}, `--reservation: reservation "gke"`},
		{[]string{"--max-pods=-1"}, "--max-pods -1"},
		{[]string{"--ephemeral-storage=lots"}, `--ephemeral-storage "lots"`},
		{[]string{"--ephemeral-storage=0"}, `--ephemeral-storage "0"`},
		{[]string{"--provider-ids=exact"}, `--provider-ids "exact"`},
		{[]string{"--device-plugin-delay=-1s"}, "--device-plugin-delay -1s"},
		{[]string{"--startup-taint-delay=-1s"}, "--startup-taint-delay -1s"},
		{[]string{"--startup-taint=agent-not-ready"}, `--startup-taint: taint "agent-not-ready"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parse(t, tt.args...).realism()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("realism() error %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestRunRejectsNegativeJitter(t *testing.T) {
	err := run(t.Context(), parse(t, "--boot-jitter=-1s"))
	if err == nil || !strings.Contains(err.Error(), "--boot-jitter -1s") {
		t.Fatalf("run error %v, want one naming --boot-jitter -1s", err)
	}
}

// TestOperationFlags: the operation flags reach the configuration, and
// out-of-range values are refused with the flag and value named.
func TestOperationFlags(t *testing.T) {
	cfg := parse(t, "--extension-delay=5m", "--fixed-operations", "--no-preemption")
	if cfg.extensionDelay != 5*time.Minute || !cfg.fixedOperations || !cfg.noPreemption {
		t.Fatalf("config %+v", cfg)
	}
	if d := parse(t); d.fixedOperations || d.noPreemption || d.extensionDelay != 0 {
		t.Fatalf("defaults %+v, want Azure's: operations as long as their VMs, preemption", d)
	}
	for _, tc := range []struct{ arg, want string }{
		{"--extension-delay=-1s", "--extension-delay -1s"},
	} {
		if err := run(t.Context(), parse(t, tc.arg)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run error %v, want one naming %s", err, tc.want)
		}
	}
}

// TestScaleSetOptionFlags: --flexible, --overprovision, --spot and
// --computer-name-prefix
// apply to the --scale-set they name; a flag naming none, or a bad
// policy, is refused with the flag and value named.
func TestScaleSetOptionFlags(t *testing.T) {
	cfg := parse(t, "--scale-set=rg-a/gpu:Standard_D16s_v5:0", "--scale-set=rg-b/gpu:Standard_D16s_v5:0", "--scale-set=rg-b/spot:Standard_D16s_v5:0",
		"--flexible=RG-B/gpu", "--spot=rg-b/spot:Delete", "--spot=rg-a/gpu", "--overprovision=rg-b/spot",
		"--computer-name-prefix=rg-a/gpu:aks-gpu-a-vmss", "--computer-name-prefix=rg-b/gpu:aks-gpu-b-vmss")
	specs := make([]armsim.ScaleSetSpec, 0, len(cfg.scaleSets))
	for _, s := range cfg.scaleSets {
		spec, err := parseScaleSet(s)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, spec)
	}
	if err := cfg.applySetOptions(specs); err != nil {
		t.Fatal(err)
	}
	want := []armsim.ScaleSetSpec{
		{ResourceGroup: "rg-a", Name: "gpu", SKU: "Standard_D16s_v5", Spot: true, ComputerNamePrefix: "aks-gpu-a-vmss"},
		{ResourceGroup: "rg-b", Name: "gpu", SKU: "Standard_D16s_v5", Flexible: true, ComputerNamePrefix: "aks-gpu-b-vmss"},
		{ResourceGroup: "rg-b", Name: "spot", SKU: "Standard_D16s_v5", Spot: true, EvictionPolicy: armsim.EvictionDelete, Overprovision: true},
	}
	if !reflect.DeepEqual(specs, want) {
		t.Fatalf("specs\n got %+v\nwant %+v", specs, want)
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--flexible=rg/none"}, `--flexible "rg/none": rg/none is no --scale-set`},
		{[]string{"--overprovision=rg/none"}, `--overprovision "rg/none": rg/none is no --scale-set`},
		{[]string{"--flexible=rg/gpu", "--overprovision=rg/gpu"}, `--overprovision "rg/gpu": a Flexible scale set does not overprovision`},
		{[]string{"--spot=rg/gpu:Hibernate"}, `--spot "rg/gpu:Hibernate": eviction policy "Hibernate"`},
		{[]string{"--computer-name-prefix=rg/gpu"}, `--computer-name-prefix "rg/gpu": want rg/name:prefix`},
	} {
		err := run(t.Context(), parse(t, append([]string{"--scale-set=rg/gpu:Standard_D16s_v5:0"}, tc.args...)...))
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%v: %v, want an error containing %s", tc.args, err, tc.wantErr)
		}
	}
}
