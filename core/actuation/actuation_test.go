package actuation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	apiv1 "k8s.io/api/core/v1"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/inmemory"
	to "github.com/vmss-autoscaler/vmss-autoscaler/internal/testobjects"
)

func TestDeleteByGroup(t *testing.T) {
	p := inmemory.New()
	a := p.AddGroup("a", 0, 10, to.Node("a", "4", "8Gi"), inmemory.WithTarget(3))
	b := p.AddGroup("b", 0, 10, to.Node("b", "4", "8Gi"), inmemory.WithTarget(2))
	b.SetDeleteError(errors.New("ARM said no"))
	groups := GroupsByID(p.NodeGroups())
	batch := map[string][]string{
		"b":    b.ProviderIDs()[:1],
		"a":    a.ProviderIDs()[:2],
		"gone": {"inmemory://gone/0"},
		"none": nil,
	}
	var calls []string
	DeleteByGroup(context.Background(), groups, batch, Same, func(id string, ids []string, err error) {
		calls = append(calls, fmt.Sprintf("%s:%d:%v", id, len(ids), err != nil))
		if err != nil && !strings.Contains(err.Error(), "node group "+id) {
			t.Errorf("error %q does not name node group %s", err, id)
		}
	})
	if got, want := strings.Join(calls, ","), "a:2:false,b:1:true,gone:1:true"; got != want {
		t.Fatalf("calls %s, want %s (one per group in name order, empty batches skipped)", got, want)
	}
	if got := a.Deleted(); len(got) != 2 {
		t.Fatalf("group a deleted %v, want 2 machines in one call", got)
	}
	if got := b.Deleted(); len(got) != 0 {
		t.Fatalf("group b deleted %v despite the error", got)
	}
}

func TestGrace(t *testing.T) {
	balloon := func(p *apiv1.Pod) bool { return p.Labels["balloon"] != "" }
	own := func(s int64) to.PodOption { return func(p *apiv1.Pod) { p.Spec.TerminationGracePeriodSeconds = &s } }
	for _, tc := range []struct {
		name string
		pod  *apiv1.Pod
		max  int
		want int64
	}{
		{"no own grace: the cap", to.Pod("p"), 600, 600},
		{"own grace below the cap", to.Pod("p", own(30)), 600, 30},
		{"own grace above the cap", to.Pod("p", own(3600)), 600, 600},
		{"a placeholder: none", to.Pod("p", own(30), to.Labels("balloon", "g")), 600, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := EvictOptions{MaxGracefulTerminationSec: tc.max, IsPlaceholder: balloon}
			if got := o.Grace(tc.pod); got != tc.want {
				t.Fatalf("grace %d, want %d", got, tc.want)
			}
		})
	}
}
