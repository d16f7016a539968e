package core

import (
	"fmt"
	"unicode/utf8"
)

// The status ConfigMap holds text tenants write (a CapacityBuffer's or a
// ProvisioningRequest's names and the messages about them) beside the
// safety state the next leader needs; a ConfigMap is at most 1 MiB
// (Kubernetes, "ConfigMaps": "The data stored in a ConfigMap cannot
// exceed 1 MiB"). So every tenant message is cut to maxStatusMessage
// bytes and the rendered status to maxStatusBytes, lists shortened first
// (their counts kept), which leaves the safety state its room whatever
// the tenants write (#40).
const (
	maxStatusMessage = 512
	maxStatusBytes   = 256 << 10
)

// capText cuts s to at most n bytes, at a rune boundary, saying so.
func capText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "… (cut)"
	cut := n - len(more)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:max(cut, 0)] + more
}

// boundStatus caps the status's tenant messages and shortens its lists
// until it renders within maxStatusBytes (counting what it left out, but
// for ReplacementsBlocked, which keeps no count);
// past that, the tenant sections go, with a note. It returns the two
// renderings of renderStatus.
func boundStatus(st *Status) (cmp, full string, err error) {
	capMessages(st)
	for round := 0; ; round++ {
		cmp, full, err = renderStatus(*st)
		if err != nil || len(full) <= maxStatusBytes {
			return cmp, full, err
		}
		if !shortenLists(st) {
			break
		}
	}
	st.Truncated = fmt.Sprintf("the status was over %d KiB: capacity buffers and provisioning requests left out", maxStatusBytes>>10)
	st.CapacityBuffers, st.ProvisioningRequests = nil, nil
	return renderStatus(*st)
}

// capMessages cuts the messages about tenants' objects.
func capMessages(st *Status) {
	if b := st.CapacityBuffers; b != nil {
		for i := range b.Buffers {
			b.Buffers[i].Buffer = capText(b.Buffers[i].Buffer, maxStatusMessage)
			b.Buffers[i].Message = capText(b.Buffers[i].Message, maxStatusMessage)
		}
	}
	if p := st.ProvisioningRequests; p != nil {
		for i := range p.Waiting {
			p.Waiting[i].Request = capText(p.Waiting[i].Request, maxStatusMessage)
			p.Waiting[i].Message = capText(p.Waiting[i].Message, maxStatusMessage)
		}
		for i := range p.Booked {
			p.Booked[i].Request = capText(p.Booked[i].Request, maxStatusMessage)
		}
		for i := range p.Requests {
			p.Requests[i].Class = capText(p.Requests[i].Class, maxStatusMessage)
		}
	}
	for i := range st.ReplacementsBlocked {
		st.ReplacementsBlocked[i] = capText(st.ReplacementsBlocked[i], maxStatusMessage)
	}
}

// shortenLists halves the longest list the status keeps a count for;
// false when none is left to shorten.
func shortenLists(st *Status) bool {
	type list struct {
		n     int
		halve func()
	}
	var lists []list
	if b := st.CapacityBuffers; b != nil {
		lists = append(lists, list{len(b.Buffers), func() {
			k := len(b.Buffers) / 2
			b.More += len(b.Buffers) - k
			b.Buffers = b.Buffers[:k]
		}})
	}
	if p := st.ProvisioningRequests; p != nil {
		lists = append(lists, list{len(p.Waiting), func() {
			k := len(p.Waiting) / 2
			p.More += len(p.Waiting) - k
			p.Waiting = p.Waiting[:k]
		}}, list{len(p.Booked), func() {
			k := len(p.Booked) / 2
			p.More += len(p.Booked) - k
			p.Booked = p.Booked[:k]
		}})
	}
	lists = append(lists, list{len(st.ReplacementsBlocked), func() {
		st.ReplacementsBlocked = st.ReplacementsBlocked[:len(st.ReplacementsBlocked)/2]
	}})
	best := -1
	for i, l := range lists {
		if l.n > 0 && (best < 0 || l.n > lists[best].n) {
			best = i
		}
	}
	if best < 0 {
		return false
	}
	lists[best].halve()
	return true
}
