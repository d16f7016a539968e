package harness

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certValidity is how long the generated certificates are valid; a control
// plane for tests lives minutes, a demo at most days.
const certValidity = 365 * 24 * time.Hour

// pki holds the paths of the generated certificates and keys.
type pki struct {
	CACert, CAKey                             string
	APIServerCert, APIServerKey               string
	ServingCert, ServingKey                   string // controller manager and scheduler
	AdminCert, AdminKey                       string
	FrontProxyCACert, FrontProxyCAKey         string
	FrontProxyClientCert, FrontProxyClientKey string
	ServiceAccountKey, ServiceAccountPub      string
}

// keyPair is a certificate with its private key.
type keyPair struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// leafSpec describes one certificate to issue and where to record its paths.
type leafSpec struct {
	cert, key *string
	name      string
	tmpl      x509.Certificate
	issuer    keyPair
}

// generatePKI writes a cluster CA, the apiserver serving certificate, a
// serving certificate for the controller manager and scheduler, an admin
// client certificate in system:masters, a front-proxy CA with its client
// certificate and an RSA service-account key pair into dir.
func generatePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	p := &pki{}
	path := func(name string) string { return filepath.Join(dir, name) }

	ca, err := newCA("harness-ca")
	if err != nil {
		return nil, err
	}
	p.CACert, p.CAKey = path("ca.crt"), path("ca.key")
	if err := writeKeyPair(ca, p.CACert, p.CAKey); err != nil {
		return nil, err
	}

	loopback := []net.IP{net.ParseIP("127.0.0.1")}
	leaves := []leafSpec{
		{&p.APIServerCert, &p.APIServerKey, "apiserver", x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			DNSNames: []string{
				"localhost", "kubernetes", "kubernetes.default",
				"kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
			},
			// 10.0.0.1 is the first address of --service-cluster-ip-range,
			// the ClusterIP of the kubernetes Service.
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		}, ca},
		{&p.ServingCert, &p.ServingKey, "serving", x509.Certificate{
			Subject:     pkix.Name{CommonName: "localhost"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			DNSNames:    []string{"localhost"},
			IPAddresses: loopback,
		}, ca},
		{&p.AdminCert, &p.AdminKey, "admin", x509.Certificate{
			Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, ca},
	}

	frontProxyCA, err := newCA("harness-front-proxy-ca")
	if err != nil {
		return nil, err
	}
	p.FrontProxyCACert, p.FrontProxyCAKey = path("front-proxy-ca.crt"), path("front-proxy-ca.key")
	if err := writeKeyPair(frontProxyCA, p.FrontProxyCACert, p.FrontProxyCAKey); err != nil {
		return nil, err
	}
	leaves = append(leaves, leafSpec{&p.FrontProxyClientCert, &p.FrontProxyClientKey, "front-proxy-client", x509.Certificate{
		Subject:     pkix.Name{CommonName: "front-proxy-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, frontProxyCA})

	if err := writeLeaves(dir, leaves); err != nil {
		return nil, err
	}
	if err := p.writeServiceAccountKeys(dir); err != nil {
		return nil, err
	}
	return p, nil
}

// writeLeaves generates each leaf certificate and writes it to dir as
// <name>.crt and <name>.key, recording those paths in the spec.
func writeLeaves(dir string, leaves []leafSpec) error {
	for _, l := range leaves {
		kp, err := newLeaf(l.tmpl, l.issuer)
		if err != nil {
			return fmt.Errorf("generating %s certificate: %w", l.name, err)
		}
		*l.cert, *l.key = filepath.Join(dir, l.name+".crt"), filepath.Join(dir, l.name+".key")
		if err := writeKeyPair(kp, *l.cert, *l.key); err != nil {
			return err
		}
	}
	return nil
}

// writeServiceAccountKeys generates the service-account signing key and
// writes it and its public key to dir as sa.key and sa.pub.
func (p *pki) writeServiceAccountKeys(dir string) error {
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return fmt.Errorf("encoding service-account public key: %w", err)
	}
	p.ServiceAccountKey, p.ServiceAccountPub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writePEM(p.ServiceAccountKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey), 0o600); err != nil {
		return err
	}
	return writePEM(p.ServiceAccountPub, "PUBLIC KEY", pub, 0o644)
}

// newCA returns a self-signed CA.
func newCA(commonName string) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("generating %s key: %w", commonName, err)
	}
	serial, err := newSerial()
	if err != nil {
		return keyPair{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return keyPair{}, fmt.Errorf("signing %s: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return keyPair{}, fmt.Errorf("parsing %s: %w", commonName, err)
	}
	return keyPair{cert: cert, key: key}, nil
}

// newLeaf returns a certificate from tmpl signed by issuer.
func newLeaf(tmpl x509.Certificate, issuer keyPair) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("generating key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return keyPair{}, err
	}
	now := time.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(certValidity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, issuer.cert, key.Public(), issuer.key)
	if err != nil {
		return keyPair{}, fmt.Errorf("signing: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return keyPair{}, fmt.Errorf("parsing: %w", err)
	}
	return keyPair{cert: cert, key: key}, nil
}

// newSerial returns a random 128-bit certificate serial number.
func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	return serial, nil
}

// writeKeyPair writes the certificate and its PKCS#8 key as PEM files.
func writeKeyPair(kp keyPair, certPath, keyPath string) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(kp.key)
	if err != nil {
		return fmt.Errorf("encoding key for %s: %w", certPath, err)
	}
	if err := writePEM(certPath, "CERTIFICATE", kp.cert.Raw, 0o644); err != nil {
		return err
	}
	return writePEM(keyPath, "PRIVATE KEY", keyDER, 0o600)
}

// writePEM writes one PEM block to path.
func writePEM(path, blockType string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
