// Package charts holds the Helm chart of vmss-autoscaler (vmss-autoscaler/)
// and, in chart_test.go, the test that renders it with Helm's own Go
// packages: every document parses, the values schema rejects bad values,
// every key of the flags ConfigMap is a flag of the binary, the RBAC covers
// what the code reads and writes, and every PromQL expression of the
// dashboards and alerts parses and names only metrics the autoscaler exports.
// The dashboards themselves are Go, in the dashboards package below.
package charts
