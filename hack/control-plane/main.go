// Command control-plane is a hyperkube-style multiplexer: one binary holding the real
// kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, compiled from the
// published k8s.io Go modules. The test suite's "cluster" tier runs it because no
// packaged Kubernetes can be installed on the build machines (DESIGN.md §8); one binary
// keeps the link time and the disk cache to a single artefact.
//
// Usage:
//
//	control-plane kube-apiserver [flags]
//	control-plane kube-controller-manager [flags]
//	control-plane kube-scheduler [flags]
//	control-plane kubectl [args]
//
// The component may also be chosen by the name the binary is invoked as (a symlink
// named kube-apiserver, kubectl, …), like hyperkube did.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"

	_ "time/tzdata" // CronJob time zones, as the upstream mains do

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// servers are the long-running components; each upstream main is exactly
// `os.Exit(cli.Run(app.NewXCommand()))`.
var servers = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	// The scheduler takes optional out-of-tree plugin registries; we add none.
	"kube-scheduler": func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := servers[name]; !ok && name != "kubectl" {
		if len(os.Args) < 2 {
			usage()
		}
		name = os.Args[1]
		// Shift so every component sees its own name as argv[0], as if run directly
		// (kubectl reads os.Args itself, not only through cobra).
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	if name == "kubectl" {
		runKubectl()
		return
	}
	newCommand, ok := servers[name]
	if !ok {
		usage()
	}
	os.Exit(cli.Run(newCommand()))
}

// runKubectl mirrors k8s.io/kubernetes/cmd/kubectl/kubectl.go.
func runKubectl() {
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
}

func usage() {
	names := []string{"kubectl"}
	for n := range servers {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: %s <component> [flags]\ncomponents: %v\n", filepath.Base(os.Args[0]), names)
	os.Exit(2)
}
