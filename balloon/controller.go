package balloon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	"k8s.io/klog/v2"
)

// Controller keeps one balloon Deployment per node group with a warm pool,
// in Options.Namespace. It reads Deployments from an informer cache the
// caller runs and writes through the typed client; when nothing changed a
// Sync is lister reads only.
//
// It only ever changes or deletes Deployments carrying the managed-by label.
type Controller struct {
	client      kubernetes.Interface
	deployments appslisters.DeploymentLister
	opts        Options

	mu sync.Mutex // serialises Sync; guards the fields below
	// pcOK: the PriorityClass was found usable (or created); it is then
	// looked at again only before creating a Deployment.
	pcOK bool
	// pcProblem says how an existing PriorityClass differs from ours.
	pcProblem string
}

// NewController returns a controller for o (which the caller validated).
// deployments may list every Deployment or only the managed ones: the
// controller filters by the managed-by label itself.
func NewController(client kubernetes.Interface, deployments appslisters.DeploymentLister, o Options) *Controller {
	return &Controller{client: client, deployments: deployments, opts: o}
}

// Change is one write the controller made to a balloon Deployment.
type Change struct {
	Group string
	Name  string // the Deployment's name, in Options.Namespace
	// Replicas is the number of balloons wanted (0 for a deletion).
	Replicas int32
	// Reason says why (for updates: which fields had drifted).
	Reason string
}

// Result says what a Sync did, for logs and events.
type Result struct {
	// PriorityClassCreated: the balloons' PriorityClass was missing and
	// has been created.
	PriorityClassCreated bool
	// PriorityClassProblem says how an existing PriorityClass differs from
	// the configured one ("" when it does not). Its value is immutable, so
	// the controller reports this and leaves the object alone.
	PriorityClassProblem string

	Created []Change
	Updated []Change
	Deleted []Change
	// Unchanged counts the groups whose Deployment was already as wanted.
	Unchanged int
}

// Changed reports whether the Sync wrote anything.
func (r Result) Changed() bool {
	return r.PriorityClassCreated || len(r.Created)+len(r.Updated)+len(r.Deleted) > 0
}

// Sync makes the balloon Deployments match specs, one per group: it creates
// the missing ones, updates those whose spec changed or was edited by
// someone (drift), and deletes managed balloon Deployments of groups no
// longer in specs. It makes sure the PriorityClass exists first, and writes
// no Deployment unless Options.Namespace exists and enforces Pod Security
// restricted (deletions go on).
//
// An error with one group does not stop the others; the returned error
// joins them all. Sync is safe to call from several goroutines (calls are
// serialised) but is meant for one loop.
func (c *Controller) Sync(ctx context.Context, specs []GroupSpec) (Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	logger := klog.FromContext(ctx).WithName("balloon")
	ctx = klog.NewContext(ctx, logger)
	o := c.opts
	var res Result

	plans, keep, errs := c.plan(ctx, specs, &res)

	// The PriorityClass: checked until found usable, and again before any
	// create (new balloons are admitted against it); not at all while no
	// group has a warm pool.
	if err := c.syncPriorityClass(ctx, specs, plans, &res); err != nil {
		errs = append(errs, err)
	}

	// The namespace: read before any write (writes are rare), so that no
	// balloon Deployment goes into a namespace whose Pod Security does not
	// enforce restricted, nor into one created, or relabelled, after start.
	var nsErr error
	if len(plans) > 0 {
		if nsErr = o.checkNamespace(ctx, c.client); nsErr != nil {
			errs = append(errs, nsErr)
		}
	}

	applyErrs, err := c.applyAll(ctx, plans, nsErr, &res)
	errs = append(errs, applyErrs...)
	if err != nil {
		return res, errors.Join(append(errs, err)...)
	}

	errs = append(errs, c.prune(ctx, keep, &res)...)

	if !res.Changed() {
		logger.V(4).Info("Balloon Deployments in sync", "groups", res.Unchanged)
	}
	return res, errors.Join(errs...)
}

// syncPriorityClass makes sure of the PriorityClass when specs has a
// group and it is not known usable yet, or a plan creates a Deployment,
// and records on res what it did and what is wrong with it.
func (c *Controller) syncPriorityClass(ctx context.Context, specs []GroupSpec, plans []plan, res *Result) error {
	needPC := len(specs) > 0 && !c.pcOK
	for _, p := range plans {
		needPC = needPC || p.creates()
	}
	var err error
	if needPC {
		res.PriorityClassCreated, err = c.ensurePriorityClass(ctx)
	}
	res.PriorityClassProblem = c.pcProblem
	return err
}

// applyAll writes the plans' Deployments, none while the namespace
// (nsErr) or the PriorityClass is not fit for them; the errors of each,
// and ctx's error when it ended first (the rest not applied).
func (c *Controller) applyAll(ctx context.Context, plans []plan, nsErr error, res *Result) ([]error, error) {
	var errs []error
	for _, p := range plans {
		if err := ctx.Err(); err != nil {
			return errs, err
		}
		if nsErr != nil {
			// Said once above; deleting stale ones below is still fine.
			continue
		}
		if !c.pcOK {
			// Until the PriorityClass is known to be usable, write no
			// balloon Deployment: its new pods might not be admitted, or
			// (non-negative value) might not be preemptible. Deleting
			// stale ones below is still fine.
			errs = append(errs, fmt.Errorf("balloons of node group %q: not writing Deployment %s/%s until the PriorityClass %s is usable",
				p.spec.Group, p.want.Namespace, p.want.Name, c.opts.PriorityClassName))
			continue
		}
		if err := c.apply(ctx, p, res); err != nil {
			errs = append(errs, err)
		}
	}
	return errs, nil
}

// plan is the write one group's Deployment needs.
type plan struct {
	spec GroupSpec
	want *appsv1.Deployment
	have *appsv1.Deployment // nil: create
	why  []string           // what drifted, for an update
}

// creates reports whether the plan creates a Deployment (a new one, or a
// new selector: the selector is immutable, so delete and create).
func (p plan) creates() bool {
	return p.have == nil || !equality.Semantic.DeepEqual(p.have.Spec.Selector, p.want.Spec.Selector)
}

// plan compares specs with the cache: the writes needed, the names of the
// Deployments to keep (those of every spec, valid or not: an invalid spec
// is an error, never a reason to delete), and the specs' errors. It counts
// the groups already in sync into res.
func (c *Controller) plan(ctx context.Context, specs []GroupSpec, res *Result) ([]plan, map[string]bool, []error) {
	logger := klog.FromContext(ctx)
	o := c.opts
	var plans []plan
	var errs []error
	keep := make(map[string]bool, len(specs))
	groups := make(map[string]bool, len(specs))
	for _, s := range specs {
		name := DeploymentName(s.Group)
		dupGroup, dupName := groups[s.Group], keep[name]
		keep[name], groups[s.Group] = true, true
		if err := validSpec(s); err != nil {
			errs = append(errs, fmt.Errorf("balloons of node group %q: %w", s.Group, err))
			continue
		}
		if dupGroup || dupName {
			errs = append(errs, fmt.Errorf("balloons of node group %q: given twice (or another group has the Deployment name %s)", s.Group, name))
			continue
		}
		want := o.Deployment(s)
		have, err := c.deployments.Deployments(o.Namespace).Get(name)
		switch {
		case apierrors.IsNotFound(err):
			plans = append(plans, plan{spec: s, want: want})
		case err != nil:
			errs = append(errs, fmt.Errorf("reading balloon Deployment %s/%s from the cache: %w", o.Namespace, name, err))
		case !o.isManaged(have.Labels):
			errs = append(errs, fmt.Errorf("balloons of node group %q: Deployment %s/%s exists without the label %s=%s; not touching it",
				s.Group, o.Namespace, name, o.ManagedByLabel, o.ManagedByValue))
		case have.DeletionTimestamp != nil:
			logger.V(2).Info("Balloon Deployment is being deleted; recreating it once it is gone", "deployment", klog.KObj(have), "nodeGroup", s.Group)
		default:
			if why := o.drift(have, want); len(why) > 0 {
				plans = append(plans, plan{spec: s, want: want, have: have, why: why})
			} else {
				res.Unchanged++
			}
		}
	}
	return plans, keep, errs
}

// apply makes one plan's write and records it in res.
func (c *Controller) apply(ctx context.Context, p plan, res *Result) error {
	logger := klog.FromContext(ctx)
	deployments := c.client.AppsV1().Deployments(p.want.Namespace)
	ns, name := p.want.Namespace, p.want.Name
	ch := Change{Group: p.spec.Group, Name: name, Replicas: p.spec.Replicas}
	switch {
	case p.have == nil:
		if _, err := deployments.Create(ctx, p.want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating balloon Deployment %s/%s: %w", ns, name, err)
		}
		ch.Reason = "missing"
		res.Created = append(res.Created, ch)
		logger.Info("Created balloon Deployment", "deployment", klog.KObj(p.want), "nodeGroup", p.spec.Group, "replicas", p.spec.Replicas)
	case p.creates():
		// The selector is immutable: delete, then create.
		if err := c.delete(ctx, p.have); err != nil {
			return fmt.Errorf("deleting balloon Deployment %s/%s to change its selector: %w", ns, name, err)
		}
		if _, err := deployments.Create(ctx, p.want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("recreating balloon Deployment %s/%s: %w", ns, name, err)
		}
		ch.Reason = "selector changed (immutable): recreated"
		res.Updated = append(res.Updated, ch)
		logger.Info("Recreated balloon Deployment", "deployment", klog.KObj(p.want), "nodeGroup", p.spec.Group, "reason", ch.Reason)
	default:
		upd := p.have.DeepCopy() // the lister's object is shared: never change it
		upd.Labels = merged(upd.Labels, p.want.Labels)
		upd.Annotations = merged(upd.Annotations, p.want.Annotations)
		upd.Spec = p.want.Spec
		if _, err := deployments.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating balloon Deployment %s/%s: %w", ns, name, err)
		}
		ch.Reason = "changed: " + strings.Join(p.why, ", ")
		res.Updated = append(res.Updated, ch)
		logger.Info("Updated balloon Deployment", "deployment", klog.KObj(upd), "nodeGroup", p.spec.Group, "replicas", p.spec.Replicas, "changed", p.why)
	}
	return nil
}

// prune deletes the managed balloon Deployments not in keep: those of
// groups that lost their warm pool.
func (c *Controller) prune(ctx context.Context, keep map[string]bool, res *Result) []error {
	logger := klog.FromContext(ctx)
	o := c.opts
	sel, err := c.managedBalloons()
	if err != nil {
		return []error{err}
	}
	list, err := c.deployments.Deployments(o.Namespace).List(sel)
	if err != nil {
		return []error{fmt.Errorf("listing balloon Deployments in %s from the cache: %w", o.Namespace, err)}
	}
	slices.SortFunc(list, func(a, b *appsv1.Deployment) int { return strings.Compare(a.Name, b.Name) })
	var errs []error
	for _, d := range list {
		if keep[d.Name] || d.DeletionTimestamp != nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return append(errs, err)
		}
		group := d.Labels[o.Label]
		if err := c.delete(ctx, d); err != nil {
			errs = append(errs, fmt.Errorf("deleting balloon Deployment %s/%s of node group %q: %w", d.Namespace, d.Name, group, err))
			continue
		}
		const why = "node group has no warm pool"
		res.Deleted = append(res.Deleted, Change{Group: group, Name: d.Name, Reason: why})
		logger.Info("Deleted balloon Deployment", "deployment", klog.KObj(d), "nodeGroup", group, "reason", why)
	}
	return errs
}

// priorityClassProblems is how have differs from the PriorityClass
// wanted: its value, its preemption policy, being the global default.
func priorityClassProblems(have, want *schedulingv1.PriorityClass) []string {
	haveNever := have.PreemptionPolicy != nil && *have.PreemptionPolicy == apiv1.PreemptNever
	var problems []string
	if have.Value != want.Value {
		problems = append(problems, fmt.Sprintf("value is %d, want %d", have.Value, want.Value))
	}
	if !haveNever {
		problems = append(problems, fmt.Sprintf("preemptionPolicy is not %s", apiv1.PreemptNever))
	}
	if have.GlobalDefault {
		problems = append(problems, "it is the global default")
	}
	return problems
}

// ensurePriorityClass creates the PriorityClass if it is missing and
// records how an existing one differs. It reports whether it created it.
// A problem blocks new balloons (c.pcOK stays false) only if the existing
// value is not negative: such balloons would not be preempted by pods of
// default priority, and the autoscaler would count room that is not free.
func (c *Controller) ensurePriorityClass(ctx context.Context) (bool, error) {
	logger := klog.FromContext(ctx)
	want := c.opts.PriorityClass()
	pcs := c.client.SchedulingV1().PriorityClasses()
	have, err := pcs.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if _, err := pcs.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return false, fmt.Errorf("creating PriorityClass %s: %w", want.Name, err)
		}
		c.pcOK, c.pcProblem = true, ""
		logger.Info("Created balloon PriorityClass", "priorityClass", want.Name, "value", want.Value)
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading PriorityClass %s: %w", want.Name, err)
	}
	problems := priorityClassProblems(have, want)
	problem := ""
	if len(problems) > 0 {
		problem = fmt.Sprintf("PriorityClass %s: %s (immutable: delete it to have the autoscaler recreate it)", want.Name, strings.Join(problems, "; "))
		if problem != c.pcProblem {
			logger.Info("Balloon PriorityClass differs from the configured one; leaving it alone", "priorityClass", want.Name, "problem", problem)
		}
	}
	c.pcProblem = problem
	if have.Value >= 0 {
		c.pcOK = false
		return false, fmt.Errorf("PriorityClass %s has value %d: balloons need a negative priority so that real pods preempt them", want.Name, have.Value)
	}
	c.pcOK = true
	return false, nil
}

// delete deletes d if it is still the object we saw (same UID), letting its
// ReplicaSets and balloons go in the background. Already gone is fine.
func (c *Controller) delete(ctx context.Context, d *appsv1.Deployment) error {
	opts := metav1.DeleteOptions{PropagationPolicy: new(metav1.DeletePropagationBackground)}
	if d.UID != "" {
		opts.Preconditions = metav1.NewUIDPreconditions(string(d.UID))
	}
	err := c.client.AppsV1().Deployments(d.Namespace).Delete(ctx, d.Name, opts)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// managedBalloons selects Deployments with the managed-by label and the
// balloon label.
func (c *Controller) managedBalloons() (labels.Selector, error) {
	managed, err := labels.NewRequirement(c.opts.ManagedByLabel, selection.Equals, []string{c.opts.ManagedByValue})
	if err != nil {
		return nil, fmt.Errorf("balloon managed-by label: %w", err)
	}
	balloon, err := labels.NewRequirement(c.opts.Label, selection.Exists, nil)
	if err != nil {
		return nil, fmt.Errorf("--balloon-label: %w", err)
	}
	return labels.NewSelector().Add(*managed, *balloon), nil
}

// validSpec rejects what the API server would, before asking it.
func validSpec(s GroupSpec) error {
	if s.Group == "" {
		return fmt.Errorf("empty node group name")
	}
	if errs := validation.IsValidLabelValue(s.Group); len(errs) > 0 {
		return fmt.Errorf("node group name is not a valid label value: %s", strings.Join(errs, "; "))
	}
	if s.Replicas < 0 {
		return fmt.Errorf("negative replicas %d", s.Replicas)
	}
	for name, q := range s.Requests {
		if q.Sign() < 0 {
			return fmt.Errorf("negative request %s=%s", name, q.String())
		}
	}
	return nil
}

// merged is base with over's entries on top (a new map).
func merged(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	maps.Copy(out, base)
	maps.Copy(out, over)
	return out
}

// drift names what of have differs from want. Only what we set is
// compared, and only where the API server leaves it as given: fields we
// leave to the server's defaults (restartPolicy, dnsPolicy,
// imagePullPolicy, progressDeadlineSeconds, ...) are not drift.
func (o Options) drift(have, want *appsv1.Deployment) []string {
	hs, ws := &have.Spec.Template.Spec, &want.Spec.Template.Spec
	checks := []struct {
		name       string
		have, want any
	}{
		{"spec hash", have.Annotations[SpecHashAnnotation], want.Annotations[SpecHashAnnotation]},
		{"labels", subset(have.Labels, want.Labels), true},
		{"replicas", replicas(have.Spec.Replicas), replicas(want.Spec.Replicas)},
		{"selector", have.Spec.Selector, want.Spec.Selector},
		{"strategy", have.Spec.Strategy, want.Spec.Strategy},
		{"paused", have.Spec.Paused, want.Spec.Paused},
		{"template labels", have.Spec.Template.Labels, want.Spec.Template.Labels},
		{"priorityClassName", hs.PriorityClassName, ws.PriorityClassName},
		{"priority", hs.Priority, ws.Priority},
		{"preemptionPolicy", hs.PreemptionPolicy, ws.PreemptionPolicy},
		{"terminationGracePeriodSeconds", hs.TerminationGracePeriodSeconds, ws.TerminationGracePeriodSeconds},
		{"automountServiceAccountToken", hs.AutomountServiceAccountToken, ws.AutomountServiceAccountToken},
		{"enableServiceLinks", hs.EnableServiceLinks, ws.EnableServiceLinks},
		{"securityContext", hs.SecurityContext, ws.SecurityContext},
		{"affinity", hs.Affinity, ws.Affinity},
		{"tolerations", hs.Tolerations, ws.Tolerations},
		{"nodeSelector", hs.NodeSelector, ws.NodeSelector},
		{"nodeName", hs.NodeName, ws.NodeName},
		{"topologySpreadConstraints", hs.TopologySpreadConstraints, ws.TopologySpreadConstraints},
		{"schedulingGates", hs.SchedulingGates, ws.SchedulingGates},
		{"resourceClaims", hs.ResourceClaims, ws.ResourceClaims},
		{"runtimeClassName", hs.RuntimeClassName, ws.RuntimeClassName},
		{"pod resources", hs.Resources, ws.Resources},
		{"hostNetwork", hs.HostNetwork, ws.HostNetwork},
		{"initContainers", containers(hs.InitContainers), containers(ws.InitContainers)},
		{"containers", containers(hs.Containers), containers(ws.Containers)},
	}
	var out []string
	for _, c := range checks {
		if !equality.Semantic.DeepEqual(c.have, c.want) {
			out = append(out, c.name)
		}
	}
	return out
}

func subset(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// replicas is a Deployment's replicas, nil meaning 1 as the server has it.
func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

// containers copies cs without the fields the API server defaults.
func containers(cs []apiv1.Container) []apiv1.Container {
	out := make([]apiv1.Container, len(cs))
	for i := range cs {
		c := cs[i].DeepCopy()
		c.ImagePullPolicy = ""
		c.TerminationMessagePath = ""
		c.TerminationMessagePolicy = ""
		out[i] = *c
	}
	return out
}
