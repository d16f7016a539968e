// Package podspec holds helpers for pods the autoscaler makes from
// templates (ProvisioningRequests' and CapacityBuffers' pods), which the
// API server never defaulted.
package podspec

import apiv1 "k8s.io/api/core/v1"

// LimitsAsRequests gives each container's resource with a limit and no
// request that limit as its request, as the API server defaults a pod (a
// PodTemplate is not defaulted so).
func LimitsAsRequests(cs []apiv1.Container) {
	for i := range cs {
		c := &cs[i]
		for name, q := range c.Resources.Limits {
			if _, ok := c.Resources.Requests[name]; ok {
				continue
			}
			if c.Resources.Requests == nil {
				c.Resources.Requests = apiv1.ResourceList{}
			}
			c.Resources.Requests[name] = q.DeepCopy()
		}
	}
}
