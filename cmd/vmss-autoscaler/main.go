// Command vmss-autoscaler is a cluster autoscaler for Kubernetes on Azure
// VM Scale Sets. Its subcommands:
//
//	vmss-autoscaler [flags]            the autoscaler (internal/app: the wiring; core: the loop)
//	vmss-autoscaler status [flags]     what the running autoscaler is doing (internal/app/statuscmd)
//	vmss-autoscaler preflight [flags]  the preflight agent of a new node (preflight/agent)
//	vmss-autoscaler version            the build's version
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/vmss-autoscaler/vmss-autoscaler/internal/app"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/app/statuscmd"
	"github.com/vmss-autoscaler/vmss-autoscaler/internal/version"
	"github.com/vmss-autoscaler/vmss-autoscaler/preflight/agent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	var err error
	sub := ""
	if len(os.Args) > 1 {
		sub = os.Args[1]
	}
	switch sub {
	case "--version", "version":
		fmt.Println(version.Get())
	case "preflight":
		err = agent.Main(ctx, os.Args[2:])
	case "status":
		err = statuscmd.Main(ctx, os.Args[2:], os.Stdout)
	default:
		err = app.Run(ctx, os.Args[1:])
	}
	stop()
	if err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "vmss-autoscaler:", err)
		}
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
