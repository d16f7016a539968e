// Package promrec is a Prometheus registerer for tests that keeps what was
// registered: the tests that list every series the binary exports (the
// chart's allow-list, the generated metrics reference) walk it.
package promrec

import "github.com/prometheus/client_golang/prometheus"

// Recorder registers on Reg and keeps the collectors, in order.
type Recorder struct {
	Reg        *prometheus.Registry
	Collectors []prometheus.Collector
}

// New is a Recorder on a new registry.
func New() *Recorder { return &Recorder{Reg: prometheus.NewRegistry()} }

// Register registers c and keeps it.
func (r *Recorder) Register(c prometheus.Collector) error {
	if err := r.Reg.Register(c); err != nil {
		return err
	}
	r.Collectors = append(r.Collectors, c)
	return nil
}

// MustRegister registers each collector, panicking on an error.
func (r *Recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister unregisters c from Reg (it stays kept).
func (r *Recorder) Unregister(c prometheus.Collector) bool { return r.Reg.Unregister(c) }
