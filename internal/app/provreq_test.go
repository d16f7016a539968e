package app

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"

	"github.com/vmss-autoscaler/vmss-autoscaler/core/provreq"
)

// --enable-provisioning-requests without the CRD runs on (no client, no
// informers) instead of crashing; with it, the client is built; a
// discovery failure is an error naming the flag; off, nothing is asked.
func TestProvisioningRequestsNeedTheirAPI(t *testing.T) {
	served := []*metav1.APIResourceList{{GroupVersion: provreq.GroupVersion.String(), APIResources: []metav1.APIResource{{Name: provreq.Resource}}}}
	for _, tc := range []struct {
		name       string
		enabled    bool
		resources  []*metav1.APIResourceList
		discovery  error
		wantClient bool
		wantErr    string
	}{
		{name: "off", enabled: false, resources: served},
		{name: "CRD absent", enabled: true},
		{name: "CRD installed", enabled: true, resources: served, wantClient: true},
		{name: "discovery fails", enabled: true, discovery: errors.New("connection refused"), wantErr: "--enable-provisioning-requests=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			d := cs.Discovery().(*fakediscovery.FakeDiscovery)
			d.Resources = tc.resources
			asked := false
			d.PrependReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
				asked = true
				return tc.discovery != nil, nil, tc.discovery
			})
			c := &config{}
			c.core.ProvisioningRequests = tc.enabled
			factory := informers.NewSharedInformerFactory(cs, 0)
			pc, err := provisioningRequests(context.Background(), c, &rest.Config{Host: "https://127.0.0.1:1"}, cs, factory)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (pc != nil) != tc.wantClient {
				t.Fatalf("client %v, want one: %v", pc, tc.wantClient)
			}
			if !tc.enabled && asked {
				t.Fatal("discovery asked with the flag off")
			}
		})
	}
}
