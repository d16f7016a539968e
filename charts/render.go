package charts

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Render renders the chart in dir (charts/vmss-autoscaler) with values, as
// release name in namespace, the way `helm template` does (the values
// schema is checked), and returns its Kubernetes documents in a stable
// order: by template file, then by position in the file. NOTES.txt and
// empty documents are left out.
func Render(dir string, values map[string]any, name, namespace string) ([]*unstructured.Unstructured, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", dir, err)
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: name, Namespace: namespace, Revision: 1, IsInstall: true},
		chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values for chart %s: %w", dir, err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("rendering chart %s: %w", dir, err)
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, f := range names {
		if filepath.Base(f) == "NOTES.txt" || !strings.HasSuffix(f, ".yaml") {
			continue
		}
		objs, err := documents(f, files[f])
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// documents are the objects of the rendered file f, one a YAML document
// (empty ones skipped).
func documents(f, content string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for i, doc := range strings.Split(content, "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(doc), "---")) == "" {
			continue
		}
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("%s document %d: %w", f, i, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out, nil
}
