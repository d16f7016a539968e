package scaleup

// ReasonCode names why a node group takes no pod, or why a pod gets no
// node (cluster-autoscaler's skipped and rejected reasons): stable, for the
// metrics and the status; the message beside it says it in words, for the
// pod's NotTriggerScaleUp event.
type ReasonCode string

// The reason codes. A group is skipped for the loop (the first five),
// full (max size, max-nodes-total), or takes the pod nowhere on its
// template node (the rest).
const (
	ReasonGroupNotRegistered ReasonCode = "group-not-registered"
	ReasonSizeUnknown        ReasonCode = "size-unknown"
	ReasonNoTemplate         ReasonCode = "no-template"
	ReasonBackoff            ReasonCode = "backoff"
	ReasonFailedThisLoop     ReasonCode = "failed-this-loop"
	ReasonMaxSize            ReasonCode = "max-size"
	ReasonMaxNodesTotal      ReasonCode = "max-nodes-total"
	ReasonGPUGroup           ReasonCode = "gpu-group-only"
	ReasonRefused            ReasonCode = "team-group"
	ReasonDoesNotFit         ReasonCode = "does-not-fit"
	ReasonGangDoesNotFit     ReasonCode = "gang-does-not-fit"
	ReasonNoNodeGroups       ReasonCode = "no-node-groups"
)

// ReasonCodes are every code, in a stable order (a metric's series exist
// from the start).
func ReasonCodes() []ReasonCode {
	return []ReasonCode{ReasonGroupNotRegistered, ReasonSizeUnknown, ReasonNoTemplate, ReasonBackoff, ReasonFailedThisLoop,
		ReasonMaxSize, ReasonMaxNodesTotal, ReasonGPUGroup, ReasonRefused, ReasonDoesNotFit, ReasonGangDoesNotFit, ReasonNoNodeGroups}
}

// reason is a code and its message.
type reason struct {
	code ReasonCode
	msg  string
}

// dominant is the code most groups gave (ties: the first in ReasonCodes).
func dominant(byGroup map[string]reason) ReasonCode {
	count := map[ReasonCode]int{}
	for _, r := range byGroup {
		count[r.code]++
	}
	best, n := ReasonNoNodeGroups, 0
	for _, c := range ReasonCodes() {
		if count[c] > n {
			best, n = c, count[c]
		}
	}
	return best
}
