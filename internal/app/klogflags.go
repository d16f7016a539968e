package app

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// klogAnnotation marks klog's flags on the flag set.
const klogAnnotation = "vmss-autoscaler.io/klog"

// klogFlags are klog's flags (-v, --vmodule, ...). Parsing the real ones
// writes klog's global state at once, which is right at start only; a
// reload parses shadows that record the values, and the live ones (-v) are
// applied once the whole ConfigMap is accepted.
type klogFlags struct {
	real *flag.FlagSet
	// defaults are klog's defaults, read before anything was parsed.
	defaults map[string]string
}

func newKlogFlags() *klogFlags {
	k := &klogFlags{real: flag.NewFlagSet("klog", flag.ContinueOnError), defaults: map[string]string{}}
	klog.InitFlags(k.real)
	k.real.VisitAll(func(f *flag.Flag) { k.defaults[f.Name] = f.DefValue })
	return k
}

// addReal adds klog's real flags (start).
func (k *klogFlags) addReal(fs *pflag.FlagSet) {
	fs.AddGoFlagSet(k.real)
	k.mark(fs)
}

// addShadows adds flags of klog's names that only record their values (a
// reload). They check what they can without touching klog: -v as a level,
// booleans and sizes as numbers.
func (k *klogFlags) addShadows(fs *pflag.FlagSet) {
	k.real.VisitAll(func(f *flag.Flag) {
		v := &shadowValue{value: k.defaults[f.Name], check: shadowCheck(f)}
		short := ""
		if len(f.Name) == 1 {
			short = f.Name // as pflag's AddGoFlagSet does: -v=2
		}
		pf := fs.VarPF(v, f.Name, short, f.Usage)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			pf.NoOptDefVal = "true"
		}
	})
	k.mark(fs)
}

// mark annotates klog's flags on fs; -v is live, the rest restart-only.
func (k *klogFlags) mark(fs *pflag.FlagSet) {
	k.real.VisitAll(func(f *flag.Flag) {
		pf := fs.Lookup(f.Name)
		if pf == nil {
			return
		}
		if pf.Annotations == nil {
			pf.Annotations = map[string][]string{}
		}
		pf.Annotations[klogAnnotation] = []string{"true"}
		if f.Name == "v" {
			pf.Annotations[reloadAnnotation] = []string{"live"}
		}
	})
}

// apply sets a klog flag for real.
func (k *klogFlags) apply(name, value string) error {
	if err := k.real.Set(name, value); err != nil {
		return fmt.Errorf("--%s=%s: %w", name, value, err)
	}
	return nil
}

func isKlog(f *pflag.Flag) bool { return len(f.Annotations[klogAnnotation]) > 0 }

// shadowValue records a klog flag's value without applying it.
type shadowValue struct {
	value string
	check func(string) error
}

func (s *shadowValue) String() string { return s.value }
func (s *shadowValue) Type() string   { return "string" }
func (s *shadowValue) Set(v string) error {
	if s.check != nil {
		if err := s.check(v); err != nil {
			return err
		}
	}
	s.value = v
	return nil
}

func shadowCheck(f *flag.Flag) func(string) error {
	if f.Name == "v" {
		// klog.Level.Set would set klog's verbosity whatever its receiver:
		// the same parse, without it.
		return func(v string) error { _, err := strconv.ParseInt(v, 10, 32); return err }
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return func(v string) error { _, err := strconv.ParseBool(v); return err }
	}
	if _, err := strconv.ParseUint(f.DefValue, 10, 64); err == nil {
		return func(v string) error { _, err := strconv.ParseUint(v, 10, 64); return err }
	}
	return nil
}
