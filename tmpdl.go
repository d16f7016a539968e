package main

import (
	_ "k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	_ "k8s.io/client-go/kubernetes"
)

func main() {}
