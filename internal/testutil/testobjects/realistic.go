package testobjects

import (
	"fmt"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// RealisticPod is pod i as an API server returns it for a Deployment's replica
// on a GPU cluster: managed fields of kube-controller-manager and the
// kubelet, kubectl's last-applied annotation carried over from the
// template, a main container and a sidecar with env, probes and mounts,
// the service account token volume, and a running status.
func RealisticPod(i int) *apiv1.Pod {
	name := fmt.Sprintf("web-7d9f8c6b5-%05d", i)
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	env := func(prefix string, n int) []apiv1.EnvVar {
		out := make([]apiv1.EnvVar, n)
		for k := range out {
			out[k] = apiv1.EnvVar{Name: fmt.Sprintf("%s_SETTING_%d", prefix, k), Value: fmt.Sprintf("value-%d-of-a-typical-length", k)}
		}
		out = append(out, apiv1.EnvVar{Name: "POD_NAME", ValueFrom: &apiv1.EnvVarSource{FieldRef: &apiv1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
		return out
	}
	probe := func(path string) *apiv1.Probe {
		return &apiv1.Probe{ProbeHandler: apiv1.ProbeHandler{HTTPGet: &apiv1.HTTPGetAction{Path: path, Port: intstr.FromInt32(8080), Scheme: apiv1.URISchemeHTTP}},
			InitialDelaySeconds: 5, TimeoutSeconds: 1, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 3}
	}
	mounts := []apiv1.VolumeMount{
		{Name: "config", MountPath: "/etc/web", ReadOnly: true},
		{Name: "kube-api-access-" + name[len(name)-5:], MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
	}
	c := func(n, image string, cpu string, port int32, envs int) apiv1.Container {
		return apiv1.Container{
			Name: n, Image: image, Command: []string{"/bin/" + n}, Args: []string{fmt.Sprintf("--port=%d", port), "--log-format=json", "--config=/etc/web/config.yaml"},
			Ports:        []apiv1.ContainerPort{{Name: n, ContainerPort: port, Protocol: apiv1.ProtocolTCP}},
			Env:          env(strings.ToUpper(n), envs),
			Resources:    apiv1.ResourceRequirements{Requests: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse(cpu), apiv1.ResourceMemory: resource.MustParse("4Gi")}},
			VolumeMounts: mounts, LivenessProbe: probe("/healthz"), ReadinessProbe: probe("/readyz"),
			TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: apiv1.TerminationMessageReadFile, ImagePullPolicy: apiv1.PullIfNotPresent,
		}
	}
	lastApplied := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"annotations":{},"labels":{"app":"web"},"name":"web","namespace":"team-a"},` +
		`"spec":{"replicas":40,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"env":[` +
		strings.Repeat(`{"name":"WEB_SETTING","value":"value-of-a-typical-length"},`, 12) + `{"name":"LAST","value":"x"}],"image":"registry.example/web:1.42.0","name":"web"}]}}}}`
	return &apiv1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "team-a", UID: types.UID(fmt.Sprintf("3f1c2d4e-0000-4000-8000-%012d", i)), ResourceVersion: fmt.Sprint(100000 + i),
			GenerateName: "web-7d9f8c6b5-", CreationTimestamp: now,
			Labels:      map[string]string{"app": "web", "pod-template-hash": "7d9f8c6b5", "team": "a"},
			Annotations: map[string]string{apiv1.LastAppliedConfigAnnotation: lastApplied, "prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f8c6b5",
				UID: "9a8b7c6d-0000-4000-8000-000000000001", Controller: new(true), BlockOwnerDeletion: new(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1",
					FieldsV1: metav1.NewFieldsV1(specFields())},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", Subresource: "status",
					FieldsV1: metav1.NewFieldsV1(statusFields)},
			},
		},
		Spec: apiv1.PodSpec{
			Containers: []apiv1.Container{c("web", "registry.example/web:1.42.0", "1", 8080, 12), c("proxy", "registry.example/proxy:2.3.1", "100m", 15001, 6)},
			Volumes: []apiv1.Volume{
				{Name: "config", VolumeSource: apiv1.VolumeSource{ConfigMap: &apiv1.ConfigMapVolumeSource{LocalObjectReference: apiv1.LocalObjectReference{Name: "web-config"}}}},
				{Name: "kube-api-access-" + name[len(name)-5:], VolumeSource: apiv1.VolumeSource{Projected: &apiv1.ProjectedVolumeSource{Sources: []apiv1.VolumeProjection{
					{ServiceAccountToken: &apiv1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: new(int64(3607))}},
					{ConfigMap: &apiv1.ConfigMapProjection{LocalObjectReference: apiv1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []apiv1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
					{DownwardAPI: &apiv1.DownwardAPIProjection{Items: []apiv1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &apiv1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
				}}}},
			},
			NodeName: fmt.Sprintf("aks-cpu-%02d-vmss%06d", i%10, i/47), ServiceAccountName: "web", SchedulerName: "default-scheduler",
			RestartPolicy: apiv1.RestartPolicyAlways, DNSPolicy: apiv1.DNSClusterFirst, TerminationGracePeriodSeconds: new(int64(30)),
			Priority: new(int32(0)), EnableServiceLinks: new(true), PreemptionPolicy: new(apiv1.PreemptLowerPriority),
			Tolerations: []apiv1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: apiv1.TolerationOpExists, Effect: apiv1.TaintEffectNoExecute, TolerationSeconds: new(int64(300))},
				{Key: "node.kubernetes.io/unreachable", Operator: apiv1.TolerationOpExists, Effect: apiv1.TaintEffectNoExecute, TolerationSeconds: new(int64(300))},
			},
		},
		Status: apiv1.PodStatus{
			Phase: apiv1.PodRunning, HostIP: "10.224.0.17", PodIP: fmt.Sprintf("10.244.%d.%d", i/250%250, i%250), StartTime: &now, QOSClass: apiv1.PodQOSBurstable,
			Conditions: []apiv1.PodCondition{
				{Type: apiv1.PodReadyToStartContainers, Status: apiv1.ConditionTrue, LastTransitionTime: now},
				{Type: apiv1.PodInitialized, Status: apiv1.ConditionTrue, LastTransitionTime: now},
				{Type: apiv1.PodReady, Status: apiv1.ConditionTrue, LastTransitionTime: now},
				{Type: apiv1.ContainersReady, Status: apiv1.ConditionTrue, LastTransitionTime: now},
				{Type: apiv1.PodScheduled, Status: apiv1.ConditionTrue, LastTransitionTime: now},
			},
			ContainerStatuses: []apiv1.ContainerStatus{
				{Name: "web", Ready: true, Image: "registry.example/web:1.42.0", ImageID: "registry.example/web@sha256:" + strings.Repeat("ab", 32),
					ContainerID: "containerd://" + strings.Repeat("cd", 32), Started: new(true), State: apiv1.ContainerState{Running: &apiv1.ContainerStateRunning{StartedAt: now}}},
				{Name: "proxy", Ready: true, Image: "registry.example/proxy:2.3.1", ImageID: "registry.example/proxy@sha256:" + strings.Repeat("ef", 32),
					ContainerID: "containerd://" + strings.Repeat("01", 32), Started: new(true), State: apiv1.ContainerState{Running: &apiv1.ContainerStateRunning{StartedAt: now}}},
			},
		},
	}
}

// specFields and statusFields are managed fields of the shape the API
// server records for such a pod.
func specFields() string {
	return `{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{},"f:prometheus.io/scrape":{}},` +
		`"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{},"f:team":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"9a8b7c6d-0000-4000-8000-000000000001\"}":{}}},` +
		`"f:spec":{"f:containers":{"k:{\"name\":\"proxy\"}":` + containerFields(6) + `,"k:{\"name\":\"web\"}":` + containerFields(12) + `},` +
		`"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:serviceAccount":{},` +
		`"f:serviceAccountName":{},"f:terminationGracePeriodSeconds":{},"f:volumes":{".":{},"k:{\"name\":\"config\"}":{".":{},"f:configMap":{".":{},"f:defaultMode":{},"f:name":{}},"f:name":{}}}}}`
}

const statusFields = `{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},` +
	`"k:{\"type\":\"Initialized\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},` +
	`"k:{\"type\":\"PodReadyToStartContainers\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},` +
	`"k:{\"type\":\"Ready\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}},` +
	`"f:containerStatuses":{},"f:hostIP":{},"f:hostIPs":{},"f:phase":{},"f:podIP":{},"f:podIPs":{".":{},"k:{\"ip\":\"10.244.1.2\"}":{".":{},"f:ip":{}}},"f:startTime":{}}}`

// containerFields are a container's managed fields with envs variables.
func containerFields(envs int) string {
	var b strings.Builder
	b.WriteString(`{".":{},"f:args":{},"f:command":{},"f:env":{".":{}`)
	for k := range envs {
		fmt.Fprintf(&b, `,"k:{\"name\":\"SETTING_%d\"}":{".":{},"f:name":{},"f:value":{}}`, k)
	}
	b.WriteString(`},"f:image":{},"f:imagePullPolicy":{},"f:livenessProbe":{".":{},"f:failureThreshold":{},"f:httpGet":{".":{},"f:path":{},"f:port":{},"f:scheme":{}},` +
		`"f:initialDelaySeconds":{},"f:periodSeconds":{},"f:successThreshold":{},"f:timeoutSeconds":{}},"f:name":{},"f:ports":{".":{},"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:name":{},"f:protocol":{}}},` +
		`"f:readinessProbe":{".":{},"f:failureThreshold":{},"f:httpGet":{".":{},"f:path":{},"f:port":{},"f:scheme":{}},"f:initialDelaySeconds":{},"f:periodSeconds":{},"f:successThreshold":{},"f:timeoutSeconds":{}},` +
		`"f:resources":{".":{},"f:requests":{".":{},"f:cpu":{},"f:memory":{}}},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{},"f:volumeMounts":{".":{},"k:{\"mountPath\":\"/etc/web\"}":{".":{},"f:mountPath":{},"f:name":{},"f:readOnly":{}}}}`)
	return b.String()
}

// RealisticNode is GPU node i as the kubelet reports it: 50 images (the
// kubelet's default nodeStatusMaxImages), its managed fields, conditions.
func RealisticNode(i int) *apiv1.Node {
	name := fmt.Sprintf("aks-gpu-%02d-vmss%06d", i%10, i)
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n := &apiv1.Node{
		TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID(fmt.Sprintf("7e6d5c4b-0000-4000-8000-%012d", i)), ResourceVersion: fmt.Sprint(200000 + i), CreationTimestamp: now,
			Labels: map[string]string{apiv1.LabelHostname: name, apiv1.LabelInstanceTypeStable: "Standard_ND96isr_H100_v5", apiv1.LabelTopologyZone: "eastus-1",
				apiv1.LabelTopologyRegion: "eastus", apiv1.LabelOSStable: "linux", apiv1.LabelArchStable: "amd64", "kubernetes.azure.com/agentpool": "gpu",
				"vmss-autoscaler.io/node-group": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", Subresource: "status",
					FieldsV1: metav1.NewFieldsV1(strings.Repeat(`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{"f:lastHeartbeatTime":{},"f:lastTransitionTime":{}}},"f:images":{}}}`, 6))},
			},
		},
		Spec: apiv1.NodeSpec{ProviderID: "azure:///subscriptions/s/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu/virtualMachines/" + fmt.Sprint(i)},
		Status: apiv1.NodeStatus{
			Capacity:    apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("96"), apiv1.ResourceMemory: resource.MustParse("1900Gi"), "nvidia.com/gpu": resource.MustParse("8")},
			Allocatable: apiv1.ResourceList{apiv1.ResourceCPU: resource.MustParse("94940m"), apiv1.ResourceMemory: resource.MustParse("1940450Mi"), "nvidia.com/gpu": resource.MustParse("8")},
			Conditions: []apiv1.NodeCondition{
				{Type: apiv1.NodeReady, Status: apiv1.ConditionTrue, LastHeartbeatTime: now, LastTransitionTime: now, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
				{Type: apiv1.NodeMemoryPressure, Status: apiv1.ConditionFalse, LastHeartbeatTime: now, LastTransitionTime: now, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
				{Type: apiv1.NodeDiskPressure, Status: apiv1.ConditionFalse, LastHeartbeatTime: now, LastTransitionTime: now, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
				{Type: apiv1.NodePIDPressure, Status: apiv1.ConditionFalse, LastHeartbeatTime: now, LastTransitionTime: now, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
			},
			Addresses: []apiv1.NodeAddress{{Type: apiv1.NodeInternalIP, Address: "10.224.0.17"}, {Type: apiv1.NodeHostName, Address: name}},
			NodeInfo: apiv1.NodeSystemInfo{MachineID: strings.Repeat("a1", 16), SystemUUID: strings.Repeat("b2", 16), BootID: strings.Repeat("c3", 16),
				KernelVersion: "5.15.0-1079-azure", OSImage: "Ubuntu 22.04.5 LTS", ContainerRuntimeVersion: "containerd://1.7.27-1", KubeletVersion: "v1.36.3",
				OperatingSystem: "linux", Architecture: "amd64"},
		},
	}
	for k := range 50 {
		n.Status.Images = append(n.Status.Images, apiv1.ContainerImage{SizeBytes: int64(1e9 + k),
			Names: []string{fmt.Sprintf("nvcr.io/nvidia/pytorch@sha256:%064d", k), fmt.Sprintf("nvcr.io/nvidia/pytorch:24.%02d-py3", k)}})
	}
	return n
}
