package agent

import (
	"bytes"
	"strings"
	"testing"
)

// `pop-agent etcd` refuses a network address without TLS and client
// certificates (exit 2, naming the flags), before it touches its data
// directory.
func TestEtcdRefusesNetworkWithoutTLS(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:2379"}, "give --cert-file, --key-file and --trusted-ca-file, or listen on 127.0.0.1"},
		{[]string{"--listen", ":2379"}, "without TLS and client certificate authentication"},
		{[]string{"--listen", "10.0.0.5:2379", "--cert-file", "c.pem", "--key-file", "k.pem"}, "give --trusted-ca-file too"},
		{[]string{"stray"}, "unexpected arguments"},
	} {
		dir := t.TempDir()
		var errOut bytes.Buffer
		code := Main(append([]string{"etcd", "--data-dir", dir + "/data"}, tc.args...), &bytes.Buffer{}, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("pop-agent etcd %q = exit %d, %q; want exit 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// --adopt-pop is a flag of the agent.
func TestAdoptPoPFlag(t *testing.T) {
	o, err := parseFlags([]string{"--adopt-pop"}, &bytes.Buffer{})
	if err != nil || !o.AdoptPoP {
		t.Errorf("--adopt-pop: %+v, %v", o, err)
	}
	var help bytes.Buffer
	_, _ = parseFlags([]string{"-h"}, &help)
	if !strings.Contains(help.String(), "-adopt-pop") || !strings.Contains(help.String(), "undeploys what it does not hold") {
		t.Errorf("help does not explain --adopt-pop:\n%s", help.String())
	}
}
