// Package fairshare takes at most so many of tenants' objects, the
// namespaces in turns, so one tenant's many cannot crowd out another's
// few (#40: CapacityBuffers and ProvisioningRequests).
package fairshare

// Take keeps at most perNS items of a namespace and total in all, from
// items sorted oldest first: the namespaces take turns, one item each
// (in the order of their oldest). held counts items a namespace already
// holds (kept whatever the bounds, as booked requests): they count
// against both bounds. The kept items come in the order they were taken
// (the turns), so what is spent in that order is shared the same way;
// left are the others, oldest first.
func Take[T any](items []T, ns func(T) string, perNS, total int, held map[string]int) (kept, left []T) {
	byNS, order := byNamespace(items, ns)
	for _, h := range held {
		total -= h
	}
	kept, taken := takeTurns(byNS, order, perNS, total, held, len(items))
	return kept, leftOut(items, ns, taken)
}

// byNamespace groups items by namespace, oldest first, and lists the
// namespaces in the order of their oldest.
func byNamespace[T any](items []T, ns func(T) string) (map[string][]T, []string) {
	byNS := map[string][]T{}
	var order []string
	for _, it := range items {
		n := ns(it)
		if _, seen := byNS[n]; !seen {
			order = append(order, n)
		}
		byNS[n] = append(byNS[n], it)
	}
	return byNS, order
}

// takeTurns keeps items of byNS (of n in all), the namespaces of order
// taking one each in turn, until total are kept or none is left within
// perNS (held counting); taken counts the kept by namespace.
func takeTurns[T any](byNS map[string][]T, order []string, perNS, total int, held map[string]int, n int) (kept []T, taken map[string]int) {
	taken = map[string]int{}
	kept = make([]T, 0, max(0, min(n, total)))
	for round := 0; len(kept) < total; round++ {
		took := false
		for _, ns := range order {
			if len(kept) == total {
				break
			}
			if its := byNS[ns]; round < len(its) && held[ns]+round < perNS {
				kept, took = append(kept, its[round]), true
				taken[ns]++
			}
		}
		if !took {
			break
		}
	}
	return kept, taken
}

// leftOut are the items not taken (taken counts them by namespace; the
// oldest of a namespace are those taken), oldest first.
func leftOut[T any](items []T, ns func(T) string, taken map[string]int) []T {
	var left []T
	for _, it := range items {
		n := ns(it)
		if taken[n] > 0 {
			taken[n]--
			continue
		}
		left = append(left, it)
	}
	return left
}
