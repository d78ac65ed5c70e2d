package testnats

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip writes a line and waits up to wait for it to come back.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string, wait time.Duration) (string, error) {
	t.Helper()
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	got, err := r.ReadString('\n')
	if len(got) > 0 {
		got = got[:len(got)-1]
	}
	return got, err
}

func TestProxy(t *testing.T) {
	p, err := NewProxy("test", "127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(t, c, r, "one", 5*time.Second); err != nil || got != "one" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	t.Run("a cut holds the bytes and keeps the connection", func(t *testing.T) {
		p.Cut()
		if got, err := roundTrip(t, c, r, "two", 300*time.Millisecond); err == nil {
			t.Fatalf("got %q through a cut proxy", got)
		}
		// A connection opened during the cut is accepted but silent.
		c2, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		r2 := bufio.NewReader(c2)
		if got, err := roundTrip(t, c2, r2, "new", 300*time.Millisecond); err == nil {
			t.Fatalf("a new connection got %q through a cut proxy", got)
		}
		p.Heal()
		if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
			t.Fatalf("after the heal: %q, %v (want the held line)", got, err)
		}
		_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if got, err := r2.ReadString('\n'); err != nil || got != "new\n" {
			t.Fatalf("the connection opened during the cut, after the heal: %q, %v", got, err)
		}
	})

	t.Run("CutOn cuts before the chunk that matches", func(t *testing.T) {
		fired := p.CutOn([]byte("PUB mc.applied"))
		if got, err := roundTrip(t, c, r, "PUB mc.work", 5*time.Second); err != nil || got != "PUB mc.work" {
			t.Fatalf("a chunk that does not match: %q, %v", got, err)
		}
		if got, err := roundTrip(t, c, r, "PUB mc.applied 12", 300*time.Millisecond); err == nil {
			t.Fatalf("the matching chunk went through: %q", got)
		}
		select {
		case <-fired:
		default:
			t.Fatal("CutOn did not report its cut")
		}
		if !p.IsCut() {
			t.Fatal("the proxy is not cut")
		}
		p.Heal()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if got, err := r.ReadString('\n'); err != nil || got != "PUB mc.applied 12\n" {
			t.Fatalf("after the heal: %q, %v", got, err)
		}
	})

	t.Run("Reset closes the connections", func(t *testing.T) {
		p.Reset()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := r.ReadString('\n'); err == nil {
			t.Fatal("the connection survived a reset")
		}
		c3, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c3.Close()
		if got, err := roundTrip(t, c3, bufio.NewReader(c3), "three", 5*time.Second); err != nil || got != "three" {
			t.Fatalf("a new connection after a reset: %q, %v", got, err)
		}
	})
}
