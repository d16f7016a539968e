//go:build !linux

package harness

import "syscall"

// childSysProcAttr returns no special attributes: parent-death signals are
// Linux-only, so elsewhere Stop must be called to end the children.
func childSysProcAttr() *syscall.SysProcAttr {
	return nil
}
