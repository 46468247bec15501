package docs

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fogdeploy/fogdeploy/fogctl/cli"
	"github.com/fogdeploy/fogdeploy/pop-agent/agent"
)

// commandLine is a command a page gives, in backticks or on a line of a
// code block: fogctl or pop-agent, its words and flags.
var commandLine = regexp.MustCompile("(?m)(?:`|^\\s*(?:\\$ )?)((?:fogctl|pop-agent)(?: [^`\\n|;&#)]*)?)")

// flagRef is a flag of a command line: --name, up to = or a space.
var flagRef = regexp.MustCompile(`(?:^|\s)--([a-z][a-z0-9-]*)`)

// TestDocsNameFlags: every flag a page gives to fogctl (of the command it
// names) or pop-agent exists, so that an operator who copies a command
// line runs what it says.
func TestDocsNameFlags(t *testing.T) {
	agentFlags, tokenFlags := popAgentFlags(t), popAgentFlags(t, "token")
	root := cli.NewCmdRoot(&cli.Factory{Global: &cli.GlobalOptions{}})
	checked := 0
	for page, text := range pages(t) {
		for _, m := range commandLine.FindAllStringSubmatch(text, -1) {
			line := m[1]
			words := strings.Fields(line)
			for _, f := range flagRef.FindAllStringSubmatch(line, -1) {
				name := f[1]
				checked++
				if words[0] == "pop-agent" {
					if len(words) > 1 && words[1] == "token" {
						if !tokenFlags[name] {
							t.Errorf("%s gives pop-agent token the flag --%s, which it does not have: %q", page, name, line)
						}
						continue
					}
					if !agentFlags[name] {
						t.Errorf("%s gives pop-agent the flag --%s, which it does not have: %q", page, name, line)
					}
					continue
				}
				if !fogctlHas(root, words[1:], name) {
					t.Errorf("%s gives fogctl the flag --%s, which that command does not have: %q", page, name, line)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d flags: the pages' command lines were not found", checked)
	}
}

// popAgentFlags are the flags of pop-agent (with sub, of that command),
// read from its usage.
func popAgentFlags(t *testing.T, sub ...string) map[string]bool {
	t.Helper()
	var out, errOut bytes.Buffer
	agent.Main(append(sub, "-h"), &out, &errOut)
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(errOut.String()+out.String(), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 3 {
		t.Fatalf("pop-agent -h listed %d flags:\n%s%s", len(flags), out.String(), errOut.String())
	}
	return flags
}

// fogctlHas reports whether the fogctl command that args name (its words
// up to the first flag) has flag name, its own or inherited.
func fogctlHas(root *cobra.Command, args []string, name string) bool {
	var path []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			break
		}
		path = append(path, a)
	}
	cmd, _, err := root.Find(path)
	if err != nil || cmd == nil {
		cmd = root
	}
	found := false
	check := func(fs *pflag.FlagSet) {
		if fs.Lookup(name) != nil {
			found = true
		}
	}
	check(cmd.Flags())
	check(cmd.InheritedFlags())
	check(root.PersistentFlags())
	return found
}
