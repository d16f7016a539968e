package balloon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	apiv1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ContainerName is the balloon container's name.
const ContainerName = "pause"

// balloonUID is the pause image's nobody user.
const balloonUID = int64(65535)

// deploymentPrefix starts every balloon Deployment's name.
const deploymentPrefix = "vmss-autoscaler-balloon-"

// GroupSpec is what the core wants for one node group's balloons.
type GroupSpec struct {
	// Group is the node group's name (the node-group label's value).
	Group string
	// Replicas is the number of balloons, one per warm node.
	Replicas int32
	// Requests is one balloon's size: the group's allocatable minus the
	// DaemonSet overhead, so that a balloon fills a node. It becomes both
	// requests and limits (copied). Resources a container cannot request
	// (such as "pods") are left out.
	Requests apiv1.ResourceList
	// Tolerations let balloons onto the group's own taints (a team taint,
	// say). A toleration of the preflight taint, or one matching every
	// taint, is dropped: a balloon must not hold a node still in preflight.
	Tolerations []apiv1.Toleration
	// NodeLabel and NodeLabelValue select the group's nodes (node
	// affinity); empty: the node-group label with the group's name. An AKS
	// node pool's nodes, say, carry kubernetes.azure.com/agentpool=<pool>.
	NodeLabel, NodeLabelValue string
}

// DeploymentName is the name of a group's balloon Deployment:
// "vmss-autoscaler-balloon-<group>" when that is a valid DNS label as it
// stands (lower case, at most 63 characters). Otherwise the group is
// lower-cased, its other characters turned into '-', cut to fit, and a hash
// of the group as given is appended, so that two groups never share a name
// (not even "GPU" and "gpu").
func DeploymentName(group string) string {
	name := deploymentPrefix + group
	if len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(group))
	suffix := hex.EncodeToString(sum[:])[:10]
	var b strings.Builder
	for _, r := range strings.ToLower(group) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	middle := b.String()
	room := validation.DNS1123LabelMaxLength - len(deploymentPrefix) - len(suffix) - 1
	if len(middle) > room {
		middle = middle[:room]
	}
	middle = strings.Trim(middle, "-")
	if middle == "" {
		return deploymentPrefix + suffix
	}
	return deploymentPrefix + middle + "-" + suffix
}

// Deployment is the balloon Deployment of one node group. It is pure: the
// same Options and GroupSpec give the same object, SpecHashAnnotation
// included. Nothing of s is aliased.
func (o Options) Deployment(s GroupSpec) *appsv1.Deployment {
	// The selector keeps the balloon label alone (it is immutable: a
	// Deployment made before the pods carried the managed-by label keeps
	// its selector and is updated in place); the pods carry the managed-by
	// label too, which IsBalloon requires.
	selector := map[string]string{o.Label: s.Group}
	podLabels := map[string]string{o.Label: s.Group, o.ManagedByLabel: o.ManagedByValue}
	d := &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      DeploymentName(s.Group),
			Namespace: o.Namespace,
			Labels:    map[string]string{o.Label: s.Group, o.ManagedByLabel: o.ManagedByValue},
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(s.Replicas),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			// Recreate, not RollingUpdate: balloons need no availability,
			// and while old balloons still hold their nodes new ones would
			// be pending, which reads as demand for more nodes. Recreate
			// starts the new balloons only once the old ones are gone.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			// No rollbacks for placeholders: keep no old ReplicaSets around.
			RevisionHistoryLimit: new(int32(0)),
			Template: apiv1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec:       o.podSpec(s),
			},
		},
	}
	d.Annotations = map[string]string{SpecHashAnnotation: specHash(d)}
	return d
}

func (o Options) podSpec(s GroupSpec) apiv1.PodSpec {
	requests := containerResources(s.Requests)
	key, value := o.NodeGroupLabel, s.Group
	if s.NodeLabel != "" {
		key, value = s.NodeLabel, s.NodeLabelValue
	}
	return apiv1.PodSpec{
		PriorityClassName:             o.PriorityClassName,
		TerminationGracePeriodSeconds: new(int64(0)),
		AutomountServiceAccountToken:  new(false),
		EnableServiceLinks:            new(false),
		SecurityContext: &apiv1.PodSecurityContext{
			RunAsNonRoot:   new(true),
			RunAsUser:      new(balloonUID),
			RunAsGroup:     new(balloonUID),
			SeccompProfile: &apiv1.SeccompProfile{Type: apiv1.SeccompProfileTypeRuntimeDefault},
		},
		Affinity: &apiv1.Affinity{NodeAffinity: &apiv1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &apiv1.NodeSelector{
				NodeSelectorTerms: []apiv1.NodeSelectorTerm{{
					MatchExpressions: []apiv1.NodeSelectorRequirement{{
						Key: key, Operator: apiv1.NodeSelectorOpIn, Values: []string{value},
					}},
				}},
			},
		}},
		Tolerations: o.tolerations(s.Tolerations),
		Containers: []apiv1.Container{{
			Name:  ContainerName,
			Image: o.Image,
			Resources: apiv1.ResourceRequirements{
				Requests: requests,
				Limits:   requests.DeepCopy(),
			},
			SecurityContext: &apiv1.SecurityContext{
				RunAsNonRoot:             new(true),
				RunAsUser:                new(balloonUID),
				ReadOnlyRootFilesystem:   new(true),
				AllowPrivilegeEscalation: new(false),
				Capabilities:             &apiv1.Capabilities{Drop: []apiv1.Capability{"ALL"}},
			},
		}},
	}
}

// tolerations copies ts without any toleration that would let a balloon
// onto a node in preflight: one for the preflight key, or one with an empty
// key and operator Exists (it matches every taint).
func (o Options) tolerations(ts []apiv1.Toleration) []apiv1.Toleration {
	var out []apiv1.Toleration
	for _, t := range ts {
		if t.Key == o.PreflightTaintKey || (t.Key == "" && t.Operator == apiv1.TolerationOpExists) {
			continue
		}
		out = append(out, *t.DeepCopy())
	}
	return out
}

// containerResources is a copy of rl with only the resources a container
// may request: cpu, memory, ephemeral-storage, hugepages-*, and extended
// resources (domain-qualified, outside kubernetes.io). Node-only
// resources such as "pods" would make the Deployment invalid.
func containerResources(rl apiv1.ResourceList) apiv1.ResourceList {
	out := apiv1.ResourceList{}
	for name, q := range rl {
		if requestable(name) {
			out[name] = q.DeepCopy()
		}
	}
	return out
}

func requestable(name apiv1.ResourceName) bool {
	switch name {
	case apiv1.ResourceCPU, apiv1.ResourceMemory, apiv1.ResourceEphemeralStorage:
		return true
	}
	s := string(name)
	if strings.HasPrefix(s, apiv1.ResourceHugePagesPrefix) {
		return true
	}
	// An extended resource, as the API server's validation has it.
	return strings.Contains(s, "/") && !strings.Contains(s, "kubernetes.io/") && !strings.HasPrefix(s, "requests.")
}

// specHash hashes what we want of d: its labels and spec. JSON of the API
// types is deterministic (map keys sorted, quantities canonical).
func specHash(d *appsv1.Deployment) string {
	b, err := json.Marshal(struct {
		Labels map[string]string     `json:"labels"`
		Spec   appsv1.DeploymentSpec `json:"spec"`
	}{d.Labels, d.Spec})
	if err != nil {
		// The API types always marshal; a failure is a programming error.
		panic(fmt.Sprintf("balloon: hashing Deployment %s: %v", d.Name, err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// PriorityClass is the balloons' PriorityClass: a negative value, so every
// pod of default priority may preempt them, and preemptionPolicy Never, so
// a balloon never preempts anything itself.
func (o Options) PriorityClass() *schedulingv1.PriorityClass {
	return &schedulingv1.PriorityClass{
		TypeMeta: metav1.TypeMeta{APIVersion: "scheduling.k8s.io/v1", Kind: "PriorityClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   o.PriorityClassName,
			Labels: map[string]string{o.ManagedByLabel: o.ManagedByValue},
		},
		Value:            o.PriorityValue,
		GlobalDefault:    false,
		PreemptionPolicy: new(apiv1.PreemptNever),
		Description:      "vmss-autoscaler balloon pods: placeholders that keep warm nodes; any real pod preempts them.",
	}
}
