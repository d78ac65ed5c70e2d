package natscreds

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// The TLS material of NATS lives in Secrets named and labelled like the
// nkey seeds (natsx.CredentialsSecretPrefix, natsx.CredentialsLabel), so
// that the dispatcher refuses them as hook credentials as it refuses the
// seeds.
const (
	// CASecret holds the CA that signs the server's and every user's
	// certificate: CACertKey and CAKeyKey. No pod mounts it; the generator
	// reads it to sign certificates that are missing.
	CASecret = "metabus-nats-ca"
	// ServerTLSSecret holds nats-server's certificate (clients and routes).
	ServerTLSSecret = "metabus-nats-server-tls"

	// CACertKey is the CA certificate, in the CA Secret and in every
	// certificate Secret (what a client verifies the server with, and the
	// server its clients).
	CACertKey = "ca.crt"
	// CAKeyKey is the CA's private key, in the CA Secret only.
	CAKeyKey = "ca.key"
	// CertKey and KeyKey are a certificate and its private key, the keys of
	// a kubernetes.io/tls Secret.
	CertKey = "tls.crt"
	KeyKey  = "tls.key"

	// DefaultValidity is how long generated certificates are valid: ten
	// years, since nothing renews them (deploy/README.md says how to
	// replace them).
	DefaultValidity = 10 * 365 * 24 * time.Hour

	secretTypeTLS = "kubernetes.io/tls"
)

// ClientTLSSecret names the Secret holding user's client certificate.
func ClientTLSSecret(user string) string { return SeedSecret(user) + "-tls" }

// TLSNames lists every Secret the TLS material of users lives in: the CA,
// the server's, then each user's, the order EnsureTLS writes them in.
func TLSNames(users []string) []string {
	out := []string{CASecret, ServerTLSSecret}
	for _, u := range users {
		out = append(out, ClientTLSSecret(u))
	}
	return out
}

// ServerDNSNames are the names nats-server's certificate must be valid for
// in namespace: the client Service service as pods dial it (short, with the
// namespace, .svc, .svc.cluster.local), every pod of the headless Service
// peers (routes dial <pod>.<peers>.<namespace>.svc), and localhost, for an
// operator's `kubectl port-forward`.
func ServerDNSNames(service, peers, namespace string) []string {
	names := []string{service, service + "." + namespace, service + "." + namespace + ".svc", service + "." + namespace + ".svc.cluster.local"}
	if peers != "" {
		names = append(names, "*."+peers+"."+namespace+".svc", "*."+peers+"."+namespace+".svc.cluster.local")
	}
	return append(names, "localhost")
}

// TLSSpec is what EnsureTLS makes.
type TLSSpec struct {
	// Users get a client certificate each (CN metabus-<user>).
	Users []string
	// ServerDNS and ServerIPs are the server certificate's names
	// (ServerDNSNames).
	ServerDNS []string
	ServerIPs []net.IP
	// Validity of new certificates; a leaf never outlives its CA.
	Validity time.Duration
	// Now is when new certificates start being valid (less a minute of
	// clock skew).
	Now time.Time
}

// EnsureTLS plans the writes that make the NATS TLS material complete: the
// CA Secret if there is none, then each missing certificate Secret (the
// server's, each user's), signed by that CA. Existing Secrets are never
// replaced. A CA Secret that does not hold a CA and its key is an error, and
// so are certificates without a CA Secret (a new CA would not be the one
// they trust): both are left for an admin. No writes means everything is in
// place.
func EnsureTLS(spec TLSSpec, have map[string]Secret) ([]Action, error) {
	if len(spec.ServerDNS) == 0 {
		return nil, errors.New("nats TLS: no server name for the certificate")
	}
	if spec.Validity <= 0 {
		return nil, fmt.Errorf("nats TLS: validity %s, want a positive duration", spec.Validity)
	}
	var plan []Action
	var ca *issuer
	if s, ok := have[CASecret]; ok {
		var err error
		if ca, err = parseCA(s.Data); err != nil {
			return nil, fmt.Errorf("the Secret %s exists but does not hold a usable CA (%v); it is left as it is: "+
				"delete it and every Secret of %v, then run `metabus credentials ensure` (or restart NATS) and restart the services",
				CASecret, err, TLSNames(spec.Users)[1:])
		}
	} else {
		for _, name := range TLSNames(spec.Users)[1:] {
			if _, ok := have[name]; ok {
				return nil, fmt.Errorf("the Secret %s exists but the CA Secret %s that signed it does not; nothing is generated, since a new CA "+
					"would not be the one it trusts: delete %v and run `metabus credentials ensure` again (or restart NATS)",
					name, CASecret, TLSNames(spec.Users)[1:])
			}
		}
		var err error
		if ca, err = newCA(spec); err != nil {
			return nil, err
		}
		plan = append(plan, Action{Verb: Create, Secret: Secret{Name: CASecret, Labels: labels(),
			Data: map[string][]byte{CACertKey: ca.certPEM, CAKeyKey: ca.keyPEM}},
			Why: fmt.Sprintf("new NATS CA (valid until %s)", ca.cert.NotAfter.UTC().Format(time.DateOnly))})
	}
	leaves := []struct{ name, cn string }{{ServerTLSSecret, "nats"}}
	for _, u := range spec.Users {
		leaves = append(leaves, struct{ name, cn string }{ClientTLSSecret(u), "metabus-" + u})
	}
	for _, l := range leaves {
		if s, ok := have[l.name]; ok {
			for _, k := range []string{CertKey, KeyKey, CACertKey} {
				if len(s.Data[k]) == 0 {
					return nil, fmt.Errorf("the Secret %s exists but has no %s; it is left as it is: delete it and run `metabus credentials ensure` again (or restart NATS)", l.name, k)
				}
			}
			continue
		}
		var dns []string
		var ips []net.IP
		if l.name == ServerTLSSecret {
			dns, ips = spec.ServerDNS, spec.ServerIPs
		}
		certPEM, keyPEM, err := ca.sign(spec, l.cn, dns, ips)
		if err != nil {
			return nil, fmt.Errorf("certificate of %s: %w", l.cn, err)
		}
		plan = append(plan, Action{Verb: Create, Secret: Secret{Name: l.name, Labels: labels(), Type: secretTypeTLS,
			Data: map[string][]byte{CertKey: certPEM, KeyKey: keyPEM, CACertKey: ca.certPEM}},
			Why: fmt.Sprintf("new NATS certificate of %s signed by %s", l.cn, CASecret)})
	}
	return plan, nil
}

// issuer is a CA that signs.
type issuer struct {
	cert            *x509.Certificate
	key             any
	certPEM, keyPEM []byte
}

// parseCA reads a CA Secret's data: a CA certificate and its matching key.
func parseCA(data map[string][]byte) (*issuer, error) {
	pair, err := tls.X509KeyPair(data[CACertKey], data[CAKeyKey])
	if err != nil {
		return nil, fmt.Errorf("%s and %s: %w", CACertKey, CAKeyKey, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CACertKey, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", CACertKey)
	}
	return &issuer{cert: cert, key: pair.PrivateKey, certPEM: data[CACertKey], keyPEM: data[CAKeyKey]}, nil
}

// newCA makes a self-signed CA.
func newCA(spec TLSSpec) (*issuer, error) {
	key, tmpl, err := template(spec, "metabus-nats-ca", spec.Now.Add(spec.Validity))
	if err != nil {
		return nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.MaxPathLenZero = true, true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("nats TLS: create the CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("nats TLS: parse the new CA: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &issuer{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM: keyPEM}, nil
}

// sign makes a key and a certificate for cn, for server and client use
// (nats-server presents its certificate on routes as a client too), with
// the names dns and ips.
func (ca *issuer) sign(spec TLSSpec, cn string, dns []string, ips []net.IP) (certPEM, keyPEM []byte, err error) {
	notAfter := spec.Now.Add(spec.Validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	key, tmpl, err := template(spec, cn, notAfter)
	if err != nil {
		return nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.DNSNames, tmpl.IPAddresses = dns, ips
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// template is a certificate for cn with a fresh P-256 key and a random
// serial, valid from a minute before spec.Now (clock skew between pods)
// to notAfter.
func template(spec TLSSpec, cn string, notAfter time.Time) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("nats TLS: generate a key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("nats TLS: serial number: %w", err)
	}
	return key, &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: []string{"metabus"}},
		NotBefore: spec.Now.Add(-time.Minute), NotAfter: notAfter,
	}, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("nats TLS: encode a key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}
