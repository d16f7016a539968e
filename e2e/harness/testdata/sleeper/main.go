// Command sleeper is a test helper for the harness's process management: it
// prints "ready", then waits for SIGTERM and exits 0, or with -ignore-term
// ignores SIGTERM and waits to be killed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ignoreTerm := flag.Bool("ignore-term", false, "ignore SIGTERM")
	flag.Parse()
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready, ignoring SIGTERM")
		for {
			time.Sleep(time.Hour) // until SIGKILL
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	fmt.Println("ready")
	<-sig
	fmt.Println("got SIGTERM, exiting")
}
