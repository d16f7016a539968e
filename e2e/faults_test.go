package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/vmss-autoscaler/vmss-autoscaler/cloudprovider/vmss/armsim"
)

// ARM applies a scale-up's PATCH and answers 500 (twice): the capacity is
// exactly what the pods need, never the delta applied twice, and it stays
// there.
func TestCommittedWriteWithALostAnswer(t *testing.T) {
	sc := newScenario(t)
	cpu := sc.scaleSet("cpu", "Standard_D16s_v5", 0, nil)
	if err := sc.s.sim.InjectFault(sc.rg, cpu, armsim.Fault{Kind: armsim.FaultCommitThenServerError, Count: 2}); err != nil {
		t.Fatal(err)
	}
	p := sc.autoscaler("one", "--nodes=0:20:"+cpu, "--node-addition-adaptive=false", "--node-addition-burst=4", "--node-addition-rate=600")
	sc.workload("web", 8, "12", 0, cpu)
	sc.eventually("8 pods Running", 2*time.Minute, allRunning(sc, 8))
	sc.steadyFor(p, 5, "capacity 8", func() (bool, string) {
		c := sc.capacity(cpu)
		return c == 8, fmt.Sprintf("capacity %d", c)
	})
	if !sc.logContains(p, "Scale-up committed though its answer was lost") {
		t.Fatal("the autoscaler never saw a lost answer: the fault did not fire")
	}
}
