// Package testutil is the room of the tests' helpers, never imported by
// the product: testobjects builds nodes and pods, heaptest measures the
// live heap, simtest builds scheduling snapshots for core's planners.
package testutil
