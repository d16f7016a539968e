package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
)

// Fault injection into a running control plane: components killed and
// started again, etcd frozen (every byte between it and the API server
// held) and thawed. The scenarios that use them assert what the autoscaler
// does while the control plane misbehaves.

// coreSpec is how a core component was started, to start it again.
type coreSpec struct {
	bin  string
	args []string
}

// Component names accepted by KillComponent and StartComponent.
const (
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
	Kwok              = "kwok"
)

// KillComponent kills a core component with SIGKILL, as a crash or an
// OOM kill would, and waits until it has exited.
func (cp *ControlPlane) KillComponent(name string) error {
	cp.mu.Lock()
	var p *Process
	for _, c := range cp.core {
		if c.Name == name {
			p = c
		}
	}
	cp.mu.Unlock()
	if p == nil {
		return fmt.Errorf("killing %s: no such component", name)
	}
	return p.Kill()
}

// StartComponent starts a killed core component again with the flags it
// first ran with, and waits until it serves: /readyz for the API server.
func (cp *ControlPlane) StartComponent(ctx context.Context, name string) error {
	cp.mu.Lock()
	spec, ok := cp.specs[name]
	idx := -1
	for i, c := range cp.core {
		if c.Name == name {
			idx = i
		}
	}
	cp.mu.Unlock()
	if !ok || idx < 0 {
		return fmt.Errorf("starting %s: no such component", name)
	}
	p, err := startProcess(ctx, name, filepath.Join(cp.LogDir, name+".log"), spec.bin, nil, spec.args...)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.core[idx] = p
	cp.mu.Unlock()
	if name == APIServer {
		return poll(ctx, componentStartTimeout, "kube-apiserver /readyz", nil, cp.apiServerReady)
	}
	return nil
}

// FreezeEtcd holds every byte between the API server and etcd until
// ThawEtcd, as an etcd that stopped answering (a full disk, a stalled
// fsync, a partition) does: requests hang, nothing is written.
func (cp *ControlPlane) FreezeEtcd() { cp.etcdProxy.freeze(true) }

// ThawEtcd lets the held bytes through again.
func (cp *ControlPlane) ThawEtcd() { cp.etcdProxy.freeze(false) }

// freezableProxy forwards TCP connections to a backend; frozen, it copies
// nothing in either direction (connections stay open).
type freezableProxy struct {
	l       net.Listener
	backend string

	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	closed bool
	conns  map[net.Conn]bool
}

func newFreezableProxy(backend string) (*freezableProxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("etcd proxy: listening on 127.0.0.1: %w", err)
	}
	p := &freezableProxy{l: l, backend: backend, conns: map[net.Conn]bool{}}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	return p, nil
}

// addr is the proxy's address, host:port.
func (p *freezableProxy) addr() string { return p.l.Addr().String() }

func (p *freezableProxy) freeze(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = on
	p.cond.Broadcast()
}

func (p *freezableProxy) close() {
	p.mu.Lock()
	p.closed, p.frozen = true, false
	for c := range p.conns {
		_ = c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	_ = p.l.Close()
}

func (p *freezableProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *freezableProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on && p.closed {
		return false
	}
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *freezableProxy) forward(client net.Conn) {
	defer func() { _ = client.Close() }()
	backend, err := net.Dial("tcp", p.backend)
	if err != nil {
		return
	}
	defer func() { _ = backend.Close() }()
	if !p.track(client, true) || !p.track(backend, true) {
		return
	}
	defer p.track(client, false)
	defer p.track(backend, false)
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(&gatedWriter{p: p, w: dst}, src)
		_ = dst.Close()
		_ = src.Close()
	}
	go pipe(backend, client)
	go pipe(client, backend)
	wg.Wait()
}

// gatedWriter waits while the proxy is frozen before each write.
type gatedWriter struct {
	p *freezableProxy
	w io.Writer
}

var errProxyClosed = errors.New("proxy closed")

func (g *gatedWriter) Write(b []byte) (int, error) {
	g.p.mu.Lock()
	for g.p.frozen && !g.p.closed {
		g.p.cond.Wait()
	}
	closed := g.p.closed
	g.p.mu.Unlock()
	if closed {
		return 0, errProxyClosed
	}
	return g.w.Write(b)
}
