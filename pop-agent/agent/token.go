// `pop-agent token`: mints a client's token of the hook API.

package agent

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/apiauth"
)

// tokenMain runs `pop-agent token --name NAME [--apps a,b] [--label KEY]
// [--rate N --burst N] [--admin] [--metrics] [--append FILE]`: it prints a
// new random token once on out, and the client's entry of a tokens file
// (with the token's SHA-256, never the token) on errOut, or appends it to
// FILE.
func tokenMain(args []string, out, errOut io.Writer) int {
	var (
		c          apiauth.Client
		apps, file string
	)
	fs := flag.NewFlagSet("pop-agent token", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.StringVar(&c.Name, "name", "", "the client's name (required): it marks the deployments it creates")
	fs.StringVar(&apps, "apps", "", "apps the client may deploy, comma-separated; * for every app")
	fs.StringVar(&c.Label, "label", "", "a label key, e.g. user: the client creates deployments that carry it and sees only those it created")
	fs.Float64Var(&c.Rate, "rate", 0, fmt.Sprintf("requests per second (default %d; an admin: no limit)", apiauth.DefaultRate))
	fs.IntVar(&c.Burst, "burst", 0, "requests at once above the rate (default twice the rate)")
	fs.BoolVar(&c.Admin, "admin", false, "every app, every deployment and /metrics")
	fs.BoolVar(&c.Metrics, "metrics", false, "may read /metrics (which names the node's apps)")
	fs.StringVar(&file, "append", "", "append the entry to this tokens file (created mode 0600) instead of printing it")
	fs.Usage = func() {
		fmt.Fprintln(errOut, "usage: pop-agent token --name NAME [--apps a,b | --admin] [--label KEY] [--rate N --burst N] [--metrics] [--append FILE]")
		fmt.Fprintln(errOut, "Prints a new token of the hook API once on stdout, and the entry of agent.tokens_file that holds its SHA-256.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(errOut, "pop-agent token: unexpected arguments %q: it takes flags only\n", fs.Args())
		return 2
	}
	if apps != "" {
		for a := range strings.SplitSeq(apps, ",") {
			c.Apps = append(c.Apps, strings.TrimSpace(a))
		}
	}
	token, entry, err := apiauth.Mint(c)
	if err != nil {
		fmt.Fprintf(errOut, "pop-agent token: the entry's fields, as the flags of the same names set them:\n%v\n", err)
		return 2
	}
	if file != "" {
		if err := appendEntry(file, c.Name, entry); err != nil {
			fmt.Fprintf(errOut, "pop-agent token: %v\n", err)
			return 1
		}
		fmt.Fprintf(errOut, "client %s appended to %s; restart the agents that read it. Its token (shown once):\n", c.Name, file)
	} else {
		fmt.Fprintf(errOut, "# client %s: append this entry to agent.tokens_file (it holds the token's SHA-256, not the token):\n%s", c.Name, entry)
		fmt.Fprintln(errOut, "# its token (shown once):")
	}
	fmt.Fprintln(out, token)
	return 0
}

// appendEntry appends entry to the tokens file at path (created mode
// 0600), refusing a name it has already, and checks the file it makes.
func appendEntry(path, name string, entry []byte) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if len(bytes.TrimSpace(old)) > 0 {
		clients, err := apiauth.LoadTokens(path)
		if err != nil {
			return fmt.Errorf("nothing appended: %w", err)
		}
		for _, c := range clients {
			if c.Name == name {
				return fmt.Errorf("nothing appended: %s has a client %s already: give another --name, or remove its entry first", path, name)
			}
		}
		if old[len(old)-1] != '\n' {
			entry = append([]byte("\n"), entry...)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(entry); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = apiauth.LoadTokens(path)
	return err
}
