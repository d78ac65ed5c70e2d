package deploy

import (
	"bufio"
	"crypto/tls"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/testnats"
	"github.com/metabus/metabus/pkg/testpki"
)

// issue writes <dir>/<name>.crt and .key, a certificate of ca, and returns
// their paths.
func issue(t *testing.T, ca *testpki.CA, dir, name string, ips ...net.IP) (certFile, keyFile string) {
	t.Helper()
	cert, key := ca.Issue(t, name, ips...)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writeTestFile(t, certFile, cert)
	writeTestFile(t, keyFile, key)
	return certFile, keyFile
}

func writeTestFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestNATSTLS (issue #14): a nats-server loaded with the shipped
// nats/tls.conf (what the Helm chart's nats.tls.enabled includes) rejects a
// client without TLS, without a client certificate of its CA, or without its
// nkey, and accepts a service connecting with the flags the chart passes
// (--nats-url tls://..., --nats-ca, --nats-cert, --nats-key, --nats-nkey).
func TestNATSTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "metabus-nats-ca")
	caFile := filepath.Join(dir, "ca.crt")
	writeTestFile(t, caFile, ca.PEM)
	serverCert, serverKey := issue(t, ca, dir, "tls", net.ParseIP("127.0.0.1"))
	if serverCert != filepath.Join(dir, "tls.crt") || serverKey != filepath.Join(dir, "tls.key") {
		t.Fatal("unexpected certificate paths")
	}
	clientCert, clientKey := issue(t, ca, dir, "metabus-watcher")
	strangerCert, strangerKey := issue(t, testpki.NewCA(t, "another-ca"), dir, "stranger")

	// The shipped tls.conf, with the Secret's mount point moved to dir.
	conf := readFile(t, filepath.Join("nats", "tls.conf"))
	if !strings.Contains(conf, `"/etc/nats/tls/`) {
		t.Fatal("nats/tls.conf no longer reads /etc/nats/tls/ (the chart's mount of Secret nats-tls)")
	}
	confPath := filepath.Join(dir, "tls.conf")
	writeTestFile(t, confPath, []byte(strings.ReplaceAll(conf, `"/etc/nats/tls/`, `"`+dir+"/")))
	opts, err := server.ProcessConfigFile(confPath)
	if err != nil {
		t.Fatalf("load nats/tls.conf: %v", err)
	}
	if opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("nats/tls.conf: TLS %v, client certificates required: %v; want both", opts.TLSConfig != nil, opts.TLSConfig != nil && opts.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert)
	}
	pub, seedFile := testnats.NewUser(t, dir, "watcher")
	addr := startTLSServer(t, confPath, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	nkey, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}

	// A client that does not speak TLS: the server announces tls_required
	// and answers a plaintext CONNECT by closing, never with a PONG.
	t.Run("rejects a plaintext client", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		r := bufio.NewReader(conn)
		info, err := r.ReadString('\n')
		if err != nil || !strings.Contains(info, `"tls_required":true`) {
			t.Fatalf("INFO %q (%v), want tls_required", info, err)
		}
		if _, err := conn.Write([]byte("CONNECT {\"verbose\":false}\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		rest, _ := io.ReadAll(r)
		if strings.Contains(string(rest), "PONG") {
			t.Fatalf("the server answered a plaintext client: %q", rest)
		}
	})

	rejected := []struct {
		reason string
		opts   []nats.Option
		want   string
	}{
		// The handshake fails on the server's side ("certificate required",
		// or the connection closed under the client's next write).
		{reason: "TLS without a client certificate, with the nkey", opts: []nats.Option{nkey, nats.RootCAs(caFile)}, want: "tls"},
		{reason: "a client certificate of another CA, with the nkey", opts: []nats.Option{nkey, nats.RootCAs(caFile), nats.ClientCert(strangerCert, strangerKey)}, want: "tls"},
		{reason: "TLS and the client certificate, without the nkey", opts: []nats.Option{nats.RootCAs(caFile), nats.ClientCert(clientCert, clientKey)}, want: "Authorization Violation"},
	}
	for _, tt := range rejected {
		t.Run("rejects "+tt.reason, func(t *testing.T) {
			nc, err := nats.Connect("tls://"+addr, append(tt.opts, nats.Timeout(5*time.Second), nats.NoReconnect())...)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("refused with %q, want %q", err, tt.want)
			}
		})
	}

	t.Run("accepts a service with its flags", func(t *testing.T) {
		var f cli.NATSFlags
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f.Register(fs)
		if err := fs.Parse([]string{
			"--nats-url=tls://" + addr, "--nats-nkey=" + seedFile,
			"--nats-ca=" + caFile, "--nats-cert=" + clientCert, "--nats-key=" + clientKey,
		}); err != nil {
			t.Fatal(err)
		}
		nc, js, err := natsx.Connect(f.Options("metabus-watcher"))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer nc.Close()
		state, err := nc.TLSConnectionState()
		if err != nil || !state.HandshakeComplete {
			t.Errorf("connection is not TLS: %v", err)
		}
		if js == nil || nc.Flush() != nil {
			t.Error("the connection does not work")
		}
	})
}

// startTLSServer runs a nats-server on a loopback port loaded from the
// configuration file conf (TLS paths already pointing at test files), with
// adjust applied to its options, and returns its address.
func startTLSServer(t *testing.T, conf string, adjust func(*server.Options)) string {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("load %s: %v", conf, err)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	if adjust != nil {
		adjust(opts)
	}
	return testnats.Serve(t, opts).Addr().String()
}
