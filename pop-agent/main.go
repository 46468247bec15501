// Command pop-agent runs on every node of a PoP.
package main

import (
	"os"

	"github.com/fogdeploy/fogdeploy/pop-agent/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:], os.Stdout, os.Stderr)) }
