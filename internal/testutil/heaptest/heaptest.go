// Package heaptest measures the live heap in benchmarks.
package heaptest

import "runtime"

// Live returns the bytes of heap still reachable: two collections (so
// nothing freed is left unswept), then the heap in use.
func Live() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
