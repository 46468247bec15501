package state_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// The PoP record is made once: concurrent makers all get the first one,
// and the first app makes it too; a node's record is written again with
// its problems, and its liveness with the lease.
func TestPoPRecord(t *testing.T) {
	st := statetest.Store(t)
	ctx := context.Background()
	pop, h, err := st.PoP(ctx)
	if err != nil || pop != nil || h.ClusterID == 0 || h.Revision == 0 {
		t.Fatalf("PoP of an empty etcd = %+v, %+v, %v; want none, with the header", pop, h, err)
	}
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			p, _, err := st.EnsurePoP(ctx)
			if err != nil {
				t.Error(err)
			}
			ids[i] = p.ID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("concurrent EnsurePoP gave %v; want one ID", ids)
		}
	}
	if p, h2, err := st.PoP(ctx); err != nil || p == nil || p.ID != ids[0] || h2.ClusterID != h.ClusterID || p.Created.IsZero() {
		t.Errorf("PoP = %+v, %+v, %v; want %s", p, h2, err, ids[0])
	}

	// The first app of an emptied etcd makes one anew.
	if _, err := st.Client().Delete(ctx, state.Prefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateApp(ctx, app("web"), false); err != nil {
		t.Fatal(err)
	}
	if p, _, err := st.PoP(ctx); err != nil || p == nil || p.ID == ids[0] {
		t.Errorf("PoP after the first app = %+v, %v; want a new one", p, err)
	}

	// A corrupt record is an error, not a missing one.
	if _, err := st.Client().Put(ctx, state.PoPKey, "{"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PoP(ctx); err == nil {
		t.Errorf("a corrupt PoP record read without an error")
	}

	// UpdateNode: problems, and Ready again after the keys were deleted.
	sess, err := st.Register(ctx, state.Node{Name: "n1", Capacity: 2}, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := st.Client().Delete(ctx, state.Prefix+"nodes/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	n := state.Node{Name: "n1", Capacity: 2, Problems: map[string]string{state.ProblemControlPlane: "fenced: why"}}
	if err := st.UpdateNode(ctx, n, sess); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Node(ctx, "n1"); err != nil || !got.Ready || got.Fence() != "fenced: why" {
		t.Errorf("node after UpdateNode = %+v, %v; want Ready and fenced", got, err)
	}
}

// The embedded etcd serves a loopback address as it is, and any other
// only with TLS and client certificate authentication.
func TestCheckEmbedded(t *testing.T) {
	names := [3]string{"--cert-file", "--key-file", "--trusted-ca-file"}
	full := state.EmbeddedTLS{CertFile: "c", KeyFile: "k", TrustedCAFile: "ca"}
	for _, tc := range []struct {
		listen string
		tls    state.EmbeddedTLS
		want   string // "" for accepted
	}{
		{"127.0.0.1:23790", state.EmbeddedTLS{}, ""},
		{"localhost:23790", state.EmbeddedTLS{}, ""},
		{"[::1]:23790", state.EmbeddedTLS{}, ""},
		{"127.0.0.1:23790", full, ""},
		{"0.0.0.0:2379", state.EmbeddedTLS{}, "give --cert-file, --key-file and --trusted-ca-file, or listen on 127.0.0.1"},
		{":2379", state.EmbeddedTLS{}, "without TLS"},
		{"10.1.2.3:2379", state.EmbeddedTLS{}, "without TLS"},
		{"10.1.2.3:2379", full, ""},
		{"10.1.2.3:2379", state.EmbeddedTLS{CertFile: "c", KeyFile: "k"}, "give --trusted-ca-file too"},
		{"127.0.0.1:23790", state.EmbeddedTLS{TrustedCAFile: "ca"}, "give --cert-file and --key-file too"},
		{"2379", state.EmbeddedTLS{}, "give host:port"},
	} {
		err := state.CheckEmbedded(tc.listen, tc.tls, names)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckEmbedded(%q, %+v) = %v; want %q", tc.listen, tc.tls, err, tc.want)
		}
	}
	if err := state.CheckEmbedded("0.0.0.0:2379", state.EmbeddedTLS{}, names); !errors.Is(err, state.ErrInsecureListen) {
		t.Errorf("0.0.0.0 without TLS: %v; want ErrInsecureListen", err)
	}
}

// The embedded etcd over TLS: a client with a certificate of the trusted
// CA is served, one without is refused.
func TestEmbeddedTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCA(t, dir)
	tls := state.EmbeddedTLS{TrustedCAFile: filepath.Join(dir, "ca.pem")}
	tls.CertFile, tls.KeyFile = issue(t, dir, "server", ca, caKey)
	clientCert, clientKey := issue(t, dir, "client", ca, caKey)
	endpoint := testenv.EtcdAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- state.EmbeddedWith(ctx, filepath.Join(dir, "data"), endpoint, tls, slog.New(slog.DiscardHandler))
	}()
	ended := false // its result taken
	defer func() {
		cancel()
		if !ended {
			<-done
		}
	}()
	var st *state.Store
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, err = state.Open(context.Background(), state.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second,
			CAFile: tls.TrustedCAFile, CertFile: clientCert, KeyFile: clientKey})
		if err == nil {
			break
		}
		select {
		case err := <-done:
			ended = true
			t.Fatalf("embedded etcd over TLS: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("a client with a certificate: %v", err)
		}
	}
	defer st.Close()
	if _, _, err := st.EnsurePoP(context.Background()); err != nil {
		t.Errorf("a write over TLS: %v", err)
	}
	for name, c := range map[string]state.Config{
		"no certificate": {Endpoints: []string{endpoint}, DialTimeout: time.Second, CAFile: tls.TrustedCAFile},
		"plain":          {Endpoints: []string{endpoint}, DialTimeout: time.Second},
	} {
		if st, err := state.Open(context.Background(), c); err == nil {
			_, _, err = st.PoP(context.Background())
			st.Close()
			if err == nil {
				t.Errorf("a client with %s was served", name)
			}
		}
	}
}

// newCA makes a CA in dir/ca.pem.
func newCA(t *testing.T, dir string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fogdeploy test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", der)
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

// issue makes a certificate of name for 127.0.0.1 (server and client use),
// signed by ca, and returns its files.
func issue(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kb)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
