// Package testpki issues throwaway certificates for tests: a CA, and leaf
// certificates valid for server and client use (as Helm's genSignedCert
// makes them), PEM-encoded.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority for one test.
type CA struct {
	Cert *x509.Certificate
	// PEM is Cert, PEM-encoded (a ca.crt).
	PEM []byte
	key *ecdsa.PrivateKey
}

// serial makes every certificate of a test process distinct.
var serial atomic.Int64

// create makes a key and a certificate for cn, valid for an hour around
// now, with the fields shape sets; it is self-signed when parent is nil.
func create(tb testing.TB, cn string, parent *CA, shape func(*x509.Certificate)) (der []byte, key *ecdsa.PrivateKey) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	shape(tmpl)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.Cert, parent.key
	}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		tb.Fatal(err)
	}
	return der, key
}

// NewCA returns a CA valid for an hour around now.
func NewCA(tb testing.TB, cn string) *CA {
	tb.Helper()
	der, key := create(tb, cn, nil, func(c *x509.Certificate) {
		c.IsCA, c.BasicConstraintsValid, c.KeyUsage = true, true, x509.KeyUsageCertSign
	})
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}
}

// Pool is a certificate pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue returns a certificate for cn (and ips as subject alternative names)
// signed by the CA, for server and client authentication, and its PKCS #8
// key, both PEM-encoded.
func (ca *CA) Issue(tb testing.TB, cn string, ips ...net.IP) (certPEM, keyPEM []byte) {
	tb.Helper()
	der, key := create(tb, cn, ca, func(c *x509.Certificate) {
		c.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		c.IPAddresses = ips
	})
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}
