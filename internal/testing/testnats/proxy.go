package testnats

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a target address
// and injects network faults between the two sides:
//
//   - Cut is a partition: every connection stays open but no byte moves in
//     either direction, and new connections are accepted but not forwarded,
//     so both sides meet silence (timeouts, unanswered pings), never a reset,
//     as when packets are dropped. Heal lets everything through again; what
//     the kernel buffered while cut is then delivered, as TCP retransmission
//     would. A side that gives up (closes) during the cut is seen by the
//     other only after the heal.
//   - Reset closes every current connection at once.
//   - CutOn cuts at a chosen moment: just before a chunk from the client
//     side containing a pattern is forwarded (that chunk is held until the
//     heal), which lets a test cut a service off in the middle of a
//     protocol exchange it recognises on the wire.
//
// The fault suite puts one in front of each NATS route (per pair of nodes)
// and each service's client connections. A proxy needs no privileges and
// works anywhere, unlike network namespaces or packet filters, and its cut
// is exact: it holds the bytes of one connection set, not a whole host.
type Proxy struct {
	name   string
	l      net.Listener
	target string

	mu      sync.Mutex
	cut     bool
	healed  chan struct{} // closed when a cut ends; replaced by each cut
	closed  bool
	done    chan struct{} // closed by Close
	conns   map[net.Conn]struct{}
	trigger *cutTrigger
	cuts    int
}

// cutTrigger is a pending CutOn.
type cutTrigger struct {
	pattern []byte
	fired   chan struct{}
}

// NewProxy listens on listen (host:port; port 0 picks one) and forwards
// each connection to target. name appears in errors.
func NewProxy(name, listen, target string) (*Proxy, error) {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	p := &Proxy{name: name, l: l, target: target, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// Addr is the proxy's listening address (host:port).
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Cut stops all traffic until Heal (see Proxy). Cutting a cut proxy does
// nothing.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked()
}

func (p *Proxy) cutLocked() {
	if p.cut || p.closed {
		return
	}
	p.cut = true
	p.cuts++
	p.healed = make(chan struct{})
}

// CutOn arms a cut that happens just before the next chunk from the
// client side containing pattern is forwarded. The returned channel is
// closed once the cut happened. A later CutOn or Heal disarms it.
func (p *Proxy) CutOn(pattern []byte) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &cutTrigger{pattern: bytes.Clone(pattern), fired: make(chan struct{})}
	p.trigger = t
	return t.fired
}

// Disarm takes back a pending CutOn.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger = nil
}

// Heal ends a cut and disarms a pending CutOn.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger = nil
	if !p.cut {
		return
	}
	p.cut = false
	close(p.healed)
}

// IsCut reports whether the proxy is cut.
func (p *Proxy) IsCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

// Cuts is how many times the proxy was cut.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Reset closes every connection open through the proxy; new ones are
// forwarded as usual.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	_ = p.l.Close()
	p.Reset()
}

// pass waits while the proxy is cut; false once it is closed.
func (p *Proxy) pass() bool {
	for {
		p.mu.Lock()
		cut, healed, closed := p.cut, p.healed, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		if !cut {
			return true
		}
		select {
		case <-healed:
		case <-p.done:
			return false
		}
	}
}

// check fires an armed CutOn whose pattern is in chunk.
func (p *Proxy) check(chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.trigger
	if t == nil || !bytes.Contains(chunk, t.pattern) {
		return
	}
	p.trigger = nil
	p.cutLocked()
	close(t.fired)
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *Proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			_ = c.Close()
			return
		}
		go p.forward(c)
	}
}

// forward connects an accepted connection to the target once the proxy
// lets traffic through, and copies both ways.
func (p *Proxy) forward(client net.Conn) {
	defer p.untrack(client)
	defer client.Close()
	if !p.pass() {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return // the target is down: the client sees the connection close
	}
	if !p.track(server) {
		_ = server.Close()
		return
	}
	defer p.untrack(server)
	defer server.Close()
	var wg sync.WaitGroup
	wg.Go(func() { p.copy(server, client, true) })
	wg.Go(func() { p.copy(client, server, false) })
	wg.Wait()
}

// copy moves bytes from src to dst, holding them while the proxy is cut,
// and closes dst's write side at src's end (or both, on an error).
func (p *Proxy) copy(dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		if !p.pass() {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if fromClient {
				p.check(buf[:n])
			}
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			} else {
				_ = dst.Close()
			}
			return
		}
	}
}
