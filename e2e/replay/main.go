// Command replay replays a public GPU cluster trace against autoscalers
// (issue #44); see README.md.
package main

func main() {}
