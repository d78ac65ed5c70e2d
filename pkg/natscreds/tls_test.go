package natscreds

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/natsx"
)

// testSpec is the spec of the kustomize install: Service nats, headless
// nats-headless, namespace metabus.
func testSpec(now time.Time) TLSSpec {
	return TLSSpec{
		Users:     Users,
		ServerDNS: ServerDNSNames("nats", "nats-headless", "metabus"),
		ServerIPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		Validity:  DefaultValidity,
		Now:       now,
	}
}

// written applies a plan to have, as the store would.
func written(have map[string]Secret, plan []Action) map[string]Secret {
	out := map[string]Secret{}
	for k, v := range have {
		out[k] = v
	}
	for _, a := range plan {
		out[a.Secret.Name] = a.Secret
	}
	return out
}

func parseCert(t *testing.T, what string, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM", what)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

// verify checks that the certificate in Secret name chains to the CA of
// the CA Secret, that its ca.crt is that CA, and, when host is set, that
// it is valid for host as a server.
func verify(t *testing.T, have map[string]Secret, name, host string, usage x509.ExtKeyUsage) {
	t.Helper()
	s := have[name]
	if string(s.Data[CACertKey]) != string(have[CASecret].Data[CACertKey]) {
		t.Errorf("%s: ca.crt is not the CA Secret's", name)
	}
	roots := x509.NewCertPool()
	roots.AddCert(parseCert(t, CASecret, have[CASecret].Data[CACertKey]))
	c := parseCert(t, name, s.Data[CertKey])
	if _, err := c.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Errorf("%s for %q: %v", name, host, err)
	}
}

// TestEnsureTLS: a fresh namespace gets a CA, a server certificate valid
// for every name the services and routes dial, and a client certificate
// per user, all labelled as credentials; what exists is never replaced;
// what cannot be completed safely is an error and no write.
func TestEnsureTLS(t *testing.T) {
	now := time.Now()
	spec := testSpec(now)
	fresh, err := EnsureTLS(spec, map[string]Secret{})
	if err != nil {
		t.Fatal(err)
	}
	complete := written(nil, fresh)

	t.Run("a fresh namespace gets every Secret, in order, labelled", func(t *testing.T) {
		var names []string
		for _, a := range fresh {
			names = append(names, a.Secret.Name)
			if a.Verb != Create || a.Secret.Labels[natsx.CredentialsLabel] != "true" {
				t.Errorf("%s: %s with labels %v, want a create labelled %s", a.Secret.Name, a.Verb, a.Secret.Labels, natsx.CredentialsLabel)
			}
			if !strings.HasPrefix(a.Secret.Name, natsx.CredentialsSecretPrefix) {
				t.Errorf("%s lacks the prefix %s the dispatcher refuses", a.Secret.Name, natsx.CredentialsSecretPrefix)
			}
			if strings.Contains(a.String(), "PRIVATE KEY") {
				t.Errorf("the log line carries a key: %s", a)
			}
		}
		want := []string{"metabus-nats-ca", "metabus-nats-server-tls", "metabus-nats-watcher-tls", "metabus-nats-dispatcher-tls",
			"metabus-nats-applier-tls", "metabus-nats-revisions-tls", "metabus-nats-operator-tls", "metabus-nats-operator-admin-tls", "metabus-nats-events-tls"}
		if diff := cmp.Diff(want, names); diff != "" {
			t.Errorf("written (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(want, TLSNames(Users)); diff != "" {
			t.Errorf("TLSNames (-want +got):\n%s", diff)
		}
	})

	t.Run("the server certificate is valid for the Service, the routes and a port-forward", func(t *testing.T) {
		for _, host := range []string{"nats", "nats.metabus", "nats.metabus.svc", "nats.metabus.svc.cluster.local",
			"nats-0.nats-headless.metabus.svc", "nats-2.nats-headless.metabus.svc.cluster.local", "localhost", "127.0.0.1"} {
			verify(t, complete, ServerTLSSecret, host, x509.ExtKeyUsageServerAuth)
		}
		// Routes present the server certificate as clients.
		verify(t, complete, ServerTLSSecret, "", x509.ExtKeyUsageClientAuth)
		c := parseCert(t, "server", complete[ServerTLSSecret].Data[CertKey])
		for _, bad := range []string{"nats.other", "nats-0.nats-headless.other.svc", "example.com"} {
			if c.VerifyHostname(bad) == nil {
				t.Errorf("the server certificate is valid for %s", bad)
			}
		}
	})

	t.Run("every user gets a client certificate of the CA", func(t *testing.T) {
		for _, u := range Users {
			verify(t, complete, ClientTLSSecret(u), "", x509.ExtKeyUsageClientAuth)
			c := parseCert(t, u, complete[ClientTLSSecret(u)].Data[CertKey])
			if c.Subject.CommonName != "metabus-"+u || len(c.DNSNames) != 0 {
				t.Errorf("%s: CN %q names %v", u, c.Subject.CommonName, c.DNSNames)
			}
			if complete[ClientTLSSecret(u)].Type != "kubernetes.io/tls" {
				t.Errorf("%s: type %q", u, complete[ClientTLSSecret(u)].Type)
			}
			if !c.NotBefore.Before(now) || c.NotAfter.Before(now.Add(DefaultValidity-time.Hour)) {
				t.Errorf("%s: valid %s to %s", u, c.NotBefore, c.NotAfter)
			}
		}
	})

	withoutCA := written(nil, fresh[1:])
	brokenCA := written(complete, []Action{{Secret: Secret{Name: CASecret, Data: map[string][]byte{CACertKey: []byte("x"), CAKeyKey: []byte("y")}}}})
	leafAsCA := written(complete, []Action{{Secret: Secret{Name: CASecret, Data: map[string][]byte{
		CACertKey: complete[ServerTLSSecret].Data[CertKey], CAKeyKey: complete[ServerTLSSecret].Data[KeyKey]}}}})
	noKey := written(complete, []Action{{Secret: Secret{Name: ClientTLSSecret("applier"), Data: map[string][]byte{
		CertKey: complete[ClientTLSSecret("applier")].Data[CertKey], CACertKey: complete[CASecret].Data[CACertKey]}}}})
	missingTwo := map[string]Secret{}
	for k, v := range complete {
		if k != ClientTLSSecret("dispatcher") && k != ServerTLSSecret {
			missingTwo[k] = v
		}
	}
	noNames := spec
	noNames.ServerDNS = nil
	tests := []struct {
		reason    string
		spec      TLSSpec
		have      map[string]Secret
		wantNames []string
		wantErr   string
	}{
		{reason: "everything in place: nothing to write", spec: spec, have: complete},
		{reason: "missing certificates are signed by the existing CA, nothing else is touched", spec: spec, have: missingTwo,
			wantNames: []string{ServerTLSSecret, ClientTLSSecret("dispatcher")}},
		{reason: "certificates without their CA: a new CA would not be the one they trust", spec: spec, have: withoutCA,
			wantErr: "the CA Secret metabus-nats-ca that signed it does not"},
		{reason: "a CA Secret that holds no CA is left alone and reported", spec: spec, have: brokenCA,
			wantErr: "does not hold a usable CA"},
		{reason: "a CA Secret holding a leaf certificate is not used to sign", spec: spec, have: leafAsCA,
			wantErr: "is not a CA certificate"},
		{reason: "a certificate Secret without its key is left alone and reported", spec: spec, have: noKey,
			wantErr: "metabus-nats-applier-tls exists but has no tls.key"},
		{reason: "no server name", spec: noNames, have: map[string]Secret{}, wantErr: "no server name"},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			plan, err := EnsureTLS(tt.spec, tt.have)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				if plan != nil {
					t.Errorf("a plan despite the error: %v", plan)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, a := range plan {
				names = append(names, a.Secret.Name)
				if a.Verb != Create {
					t.Errorf("%s", a)
				}
			}
			if diff := cmp.Diff(tt.wantNames, names); diff != "" {
				t.Errorf("written (-want +got):\n%s", diff)
			}
			after := written(tt.have, plan)
			for name := range tt.have {
				if diff := cmp.Diff(tt.have[name], after[name]); diff != "" {
					t.Errorf("%s changed:\n%s", name, diff)
				}
			}
			for _, a := range plan {
				verify(t, after, a.Secret.Name, "", x509.ExtKeyUsageClientAuth)
			}
		})
	}
}

// TestServerDNSNames: the Helm chart's names (a release prefix) come out as
// the kustomize install's do.
func TestServerDNSNames(t *testing.T) {
	want := []string{"metabus-nats", "metabus-nats.ops", "metabus-nats.ops.svc", "metabus-nats.ops.svc.cluster.local",
		"*.metabus-nats-headless.ops.svc", "*.metabus-nats-headless.ops.svc.cluster.local", "localhost"}
	if diff := cmp.Diff(want, ServerDNSNames("metabus-nats", "metabus-nats-headless", "ops")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
