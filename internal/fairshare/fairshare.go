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
	byNS := map[string][]T{}
	var order []string
	for _, it := range items {
		n := ns(it)
		if _, seen := byNS[n]; !seen {
			order = append(order, n)
		}
		byNS[n] = append(byNS[n], it)
	}
	for _, h := range held {
		total -= h
	}
	taken := map[string]int{}
	kept = make([]T, 0, max(0, min(len(items), total)))
	for round := 0; len(kept) < total; round++ {
		took := false
		for _, n := range order {
			if len(kept) == total {
				break
			}
			if its := byNS[n]; round < len(its) && held[n]+round < perNS {
				kept, took = append(kept, its[round]), true
				taken[n]++
			}
		}
		if !took {
			break
		}
	}
	for _, it := range items {
		n := ns(it)
		if taken[n] > 0 {
			taken[n]--
			continue
		}
		left = append(left, it)
	}
	return kept, left
}
