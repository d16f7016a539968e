package harness

import "syscall"

// childSysProcAttr makes the kernel SIGKILL a child when the test process
// dies, so a crashed or interrupted test leaves no control plane behind.
// (Pdeathsig fires when the forking OS thread exits; the Go runtime keeps its
// threads for the life of the process unless a goroutine exits while locked
// to one, which this package never does.)
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
