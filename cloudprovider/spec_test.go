package cloudprovider

import (
	"strings"
	"testing"
)

func TestParseNodeGroupSpec(t *testing.T) {
	tests := []struct {
		in      string
		want    NodeGroupSpec
		wantErr string
	}{
		{in: "0:10:gpu-a100", want: NodeGroupSpec{Min: 0, Max: 10, Name: "gpu-a100"}},
		{in: "3:3:cpu", want: NodeGroupSpec{Min: 3, Max: 3, Name: "cpu"}},
		{in: "0:8:MC_rg_cluster_eastus/gpu", want: NodeGroupSpec{Min: 0, Max: 8, ResourceGroup: "MC_rg_cluster_eastus", Name: "gpu"}},
		{in: "10:1:gpu", wantErr: `--nodes="10:1:gpu": min 10 is greater than max 1`},
		{in: "a:1:gpu", wantErr: `min "a" is not a non-negative integer`},
		{in: "0:-1:gpu", wantErr: `max "-1" is not`},
		{in: "0:10", wantErr: "want min:max:name or min:max:resource-group/name"},
		{in: "0:0:gpu", wantErr: "max must be at least 1"},
		{in: "0:5:", wantErr: "must be a scale set name"},
		{in: "0:5:rg/", wantErr: `name "rg/" must be a scale set name`},
		{in: "0:5:/gpu", wantErr: `resource group "" of scale set gpu must be a resource group name`},
		{in: "0:5:a/b/c", wantErr: `name "a/b/c" must be a scale set name`},
		{in: "0:5:r g/gpu", wantErr: `resource group "r g" of scale set gpu`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseNodeGroupSpec(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseNodeGroupSpecs(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		wantErr string
	}{
		{"distinct names", []string{"0:1:a", "0:2:b"}, ""},
		{"one name in two resource groups", []string{"0:1:rg1/gpu", "0:2:rg2/gpu"}, ""},
		{"a name twice", []string{"0:1:a", "0:2:A"}, `node group A is given twice (also --nodes="0:1:a")`},
		{"a scale set twice", []string{"0:1:rg1/gpu", "0:2:RG1/GPU"}, "node group RG1/GPU is given twice"},
		{"alone, then with its resource group", []string{"0:1:gpu", "0:2:rg1/gpu"}, `scale set name gpu is given alone and with a resource group (also --nodes="0:1:gpu")`},
		{"with its resource group, then alone", []string{"0:1:rg1/gpu", "0:2:gpu"}, "scale set name gpu is given alone and with a resource group"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNodeGroupSpecs(tc.in)
			if tc.wantErr == "" {
				if err != nil || len(got) != len(tc.in) {
					t.Fatalf("got %+v, %v; want %d specs", got, err, len(tc.in))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
