// Package cloudprovider defines what the autoscaler core needs from a cloud:
// node groups that can be resized, the instances behind them, and a template
// node for scale-from-zero. Implementations live in sub-packages (vmss for
// Azure, inmemory for tests); none of them may import core.
package cloudprovider

import (
	"context"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
)

// CloudProvider is the cloud as the core sees it.
type CloudProvider interface {
	// Name is a short identifier such as "azure".
	Name() string
	// NodeGroups returns every node group the autoscaler manages. It reads the
	// provider's cache and never calls the cloud.
	NodeGroups() []NodeGroup
	// NodeGroupForNode returns the group a node belongs to, looked up by its
	// providerID in O(1). It returns (nil, nil) for nodes the autoscaler does
	// not manage.
	NodeGroupForNode(node *apiv1.Node) (NodeGroup, error)
	// Refresh brings the provider's cache up to date. It is called once per
	// loop; a provider decides itself when its cache is stale.
	Refresh(ctx context.Context) error
}

// NodeGroup is a set of identical machines that scale together (a scale set).
type NodeGroup interface {
	// ID identifies the group in logs, metrics, events and flags.
	ID() string
	MinSize() int
	MaxSize() int
	// TargetSize is the size the cloud was last asked for. It returns an error
	// matched by IsSizeUnknown when the provider cannot tell; the core then
	// leaves the group alone for the loop.
	TargetSize() (int, error)
	// IncreaseSize asks the cloud for delta more machines. It must not block
	// on the machines being created.
	IncreaseSize(ctx context.Context, delta int) error
	// DeleteNodes deletes the machines with the given provider IDs and lowers
	// the target accordingly. The IDs may belong to machines that never
	// registered as Kubernetes nodes.
	DeleteNodes(ctx context.Context, providerIDs []string) error
	// DecreaseTargetSize lowers the target by delta (a negative number) for
	// machines that were requested but not created. It never deletes a
	// running machine.
	DecreaseTargetSize(ctx context.Context, delta int) error
	// Instances lists the group's machines from the provider's cache.
	Instances() ([]Instance, error)
	// TemplateNode describes a node the group would create, for scaling from
	// zero. Its labels, taints, capacity and allocatable must be those of a
	// real node of the group.
	TemplateNode() (*apiv1.Node, error)
	// Options returns the group's overrides of the given defaults.
	Options(defaults GroupOptions) GroupOptions
}

// SizeLimited is implemented by node groups the cloud lets hold fewer
// machines than their configured max (a scale set's platform limit).
// Their MaxSize is already the lower of the two.
type SizeLimited interface {
	// SizeLimit returns the configured max, the most machines the cloud
	// lets the group hold (0 when no limit is known) and why.
	SizeLimit() (configuredMax, limit int, reason string)
}

// InstancesAged is implemented by node groups whose machines are listed
// less often than their size is read (a scale set's VM list): when the
// last list failed, Instances is an older list's.
type InstancesAged interface {
	// InstancesAge returns how old the group's machine list is at now and
	// why the last list failed ("" when it did not).
	InstancesAge(now time.Time) (time.Duration, string)
}

// InstanceState is the life-cycle stage of a machine.
type InstanceState int

const (
	// InstanceRunning is a machine that exists and is running.
	InstanceRunning InstanceState = iota + 1
	// InstanceCreating is a machine being created.
	InstanceCreating
	// InstanceDeleting is a machine being deleted.
	InstanceDeleting
)

func (s InstanceState) String() string {
	switch s {
	case InstanceRunning:
		return "running"
	case InstanceCreating:
		return "creating"
	case InstanceDeleting:
		return "deleting"
	default:
		return "unknown"
	}
}

// Instance is one machine of a node group.
type Instance struct {
	// ProviderID is the ID the machine's Node object carries in spec.providerID.
	ProviderID string
	State      InstanceState
	// Error is set when the cloud reports that the machine failed (for example
	// its creation ran out of quota): a machine that is not running.
	Error *InstanceError
	// FailedRunning is set when the cloud reports the machine failed while
	// it runs: an Azure VM whose extension, data-disk attach or model update
	// failed has provisioningState Failed and power state running. It is a
	// running machine (State InstanceRunning, Error nil), never capacity in
	// error, and nothing deletes it for that: its node and pods live on.
	FailedRunning *InstanceError
}

// InstanceError is a failure the cloud reported for one machine.
type InstanceError struct {
	Class   ErrorClass
	Code    string
	Message string
}

// GroupOptions are the per-group settings a group may override.
type GroupOptions struct {
	ScaleDownUtilizationThreshold    float64
	ScaleDownGPUUtilizationThreshold float64
	ScaleDownUnneededTime            time.Duration
	ScaleDownUnreadyTime             time.Duration
	MaxNodeProvisionTime             time.Duration
}

// ProviderIDKey is the form in which provider IDs are compared: Azure's
// resource IDs are case-insensitive, and the same VM's ID differs in case
// between ARM (the resource group as created, e.g. MC_rg_cluster_eastus)
// and its Node (the Azure cloud provider lower-cases the resource group).
// The slashes after the scheme do not count either ("azure:///subscriptions/…"
// and "azure://subscriptions/…" name one VM, and NodeGroupForNode accepts
// both): a Node whose ID is spelled one way must be found for a machine
// listed the other way, or its machine would look never registered — and
// be deleted as such, with the Node's pods on it.
func ProviderIDKey(id string) string {
	id = strings.ToLower(id)
	scheme, rest, ok := strings.Cut(id, "://")
	if !ok {
		return id
	}
	return scheme + ":///" + strings.Trim(rest, "/")
}

// EvictionReporter is implemented by providers whose cloud takes machines
// back by itself: Azure evicts Spot VMs when it needs their capacity (or
// their price rises past the maximum), deleting them (eviction policy
// Delete: the VM vanishes and the scale set's capacity drops) or stopping
// them (Deallocate: the VM stays, runs nothing and holds its cores in the
// quota, reported as an instance with a ClassEvicted error for the core to
// delete). The core reports evictions and backs off a group that keeps
// losing machines, so scale-up buys capacity elsewhere (the priority
// expander's fallback). A provider that does not implement it reports none.
type EvictionReporter interface {
	// Evictions returns the evictions the refreshes since the last call
	// noticed, in the order noticed, and forgets them. It never calls the
	// cloud.
	Evictions() []Eviction
}

// Eviction is a machine the cloud took back.
type Eviction struct {
	// Group is the ID of the machine's node group when it was noticed.
	Group      string
	ProviderID string
	// Deallocated says the machine was stopped and stays (to be deleted);
	// otherwise the cloud deleted it.
	Deallocated bool
}

// RepairAction is an in-place repair of one machine: the machine (and its
// node's name) is kept, so scarce capacity is not given back.
type RepairAction string

// The repair actions, cheapest first. AKS's node auto-repair tries them
// in this order before it replaces a node ("Automatically repair Azure
// Kubernetes Service (AKS) nodes": reboot, reimage, redeploy).
const (
	RepairReboot   RepairAction = "reboot"
	RepairReimage  RepairAction = "reimage"
	RepairRedeploy RepairAction = "redeploy"
)

// Repairer is implemented by node groups whose machines can be repaired in
// place (Azure: restart, reimage and redeploy of a scale-set VM). A
// provider that does not implement it only replaces.
type Repairer interface {
	// CanRepair says whether the group's machines can be repaired at all
	// (a Flexible scale set's cannot yet; a wrapper around a group that
	// cannot repair answers false): when not, they are only replaced.
	CanRepair() bool
	// Repair asks the cloud to start action on the group's machine with
	// the provider ID and returns once the cloud accepted it; the action
	// runs on and RepairState follows it. An error matched by ErrNotSent
	// asked nothing of the cloud.
	Repair(ctx context.Context, providerID string, action RepairAction) error
	// RepairState is what the provider knows of the last repair it started
	// on the machine (false when it started none, or has forgotten it:
	// after a restart, say). It never calls the cloud.
	RepairState(providerID string) (RepairStatus, bool)
}

// RepairStatus is a repair the provider started.
type RepairStatus struct {
	Action  RepairAction
	Started time.Time
	// Done: the cloud's operation ended; Err is its failure (nil: it
	// succeeded, which says the action ran, not that the node is well).
	// Unknown: what the cloud answered leaves the outcome unknown (a
	// timeout, a 5xx, an operation no longer followed): the action may
	// have run, or still run; Err says why.
	Done    bool
	Unknown bool
	Err     error
}
