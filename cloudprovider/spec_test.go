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
		{in: "10:1:gpu", wantErr: `--nodes="10:1:gpu": min 10 is greater than max 1`},
		{in: "a:1:gpu", wantErr: `min "a" is not a non-negative integer`},
		{in: "0:-1:gpu", wantErr: `max "-1" is not`},
		{in: "0:10", wantErr: "want min:max:name"},
		{in: "0:0:gpu", wantErr: "max must be at least 1"},
		{in: "0:5:", wantErr: "must be a scale set name"},
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
	if _, err := ParseNodeGroupSpecs([]string{"0:1:a", "0:2:A"}); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("duplicate accepted: %v", err)
	}
}
