package core

import (
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// Event reasons, as in cluster-autoscaler.
const (
	EventTriggeredScaleUp  = "TriggeredScaleUp"
	EventNotTriggerScaleUp = "NotTriggerScaleUp"
	EventScaledUpGroup     = "ScaledUpGroup"
	EventFailedScaleUp     = "FailedScaleUp"
	// EventScaleUpQueued: the pod's nodes wait in the node-addition queue.
	EventScaleUpQueued = "ScaleUpQueued"
)

// podEvents writes pod events within a per-loop budget and repeats an
// unchanged event for the same pod at most once per interval: with 10,000
// pending pods, one event per pod per loop would itself load the API server.
type podEvents struct {
	rec      record.EventRecorder
	max      int
	interval time.Duration
	last     map[types.UID]sentEvent
	budget   int
	dropped  int
}

type sentEvent struct {
	reason, msg string
	at          time.Time
	epoch       uint64
}

func newPodEvents(rec record.EventRecorder, max int, interval time.Duration) *podEvents {
	return &podEvents{rec: rec, max: max, interval: interval, last: map[types.UID]sentEvent{}}
}

// startLoop resets the budget.
func (e *podEvents) startLoop() { e.budget, e.dropped = e.max, 0 }

// emit writes a pod event unless it repeats a recent one or the budget is spent.
func (e *podEvents) emit(pod *apiv1.Pod, now time.Time, epoch uint64, eventType, reason, msg string) {
	prev, ok := e.last[pod.UID]
	if ok && prev.reason == reason && prev.msg == msg && now.Sub(prev.at) < e.interval {
		prev.epoch = epoch
		e.last[pod.UID] = prev
		return
	}
	if e.budget <= 0 {
		e.dropped++
		return
	}
	e.budget--
	e.rec.Event(pod, eventType, reason, msg)
	e.last[pod.UID] = sentEvent{reason: reason, msg: msg, at: now, epoch: epoch}
}

// forget drops the memory of pods not seen in this loop's epoch.
func (e *podEvents) forget(epoch uint64) {
	for uid, s := range e.last {
		if s.epoch != epoch && s.epoch+1 != epoch {
			delete(e.last, uid)
		}
	}
}
