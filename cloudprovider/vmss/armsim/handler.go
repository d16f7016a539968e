package armsim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"k8s.io/klog/v2"
)

// Operation names counted by Server.Calls.
const (
	OpListScaleSets   = "ListScaleSets"
	OpGetScaleSet     = "GetScaleSet"
	OpUpdateScaleSet  = "UpdateScaleSet"
	OpDeleteInstances = "DeleteInstances"
	OpListVMs         = "ListVMs"
	OpGetVM           = "GetVM"
	OpListSKUs        = "ListSKUs"
	OpPollOperation   = "PollOperation"
	// OpThrottled counts requests answered with 429.
	OpThrottled = "Throttled"

	// OpListVirtualMachines lists a resource group's virtual machines
	// (the Virtual Machines API): a Flexible scale set's, with its filter.
	OpListVirtualMachines = "ListVirtualMachines"
)

const (
	// operationAPIVersion is the api-version put in operation URLs.
	operationAPIVersion = "2025-04-01"
	// maxBody bounds request bodies.
	maxBody = 1 << 20
)

// response is an answer computed under the lock and written after it.
type response struct {
	status int
	header http.Header
	body   any // marshalled to JSON; nil for no body
}

func errorResponse(status int, code, format string, args ...any) response {
	return response{status: status, body: envelope(code, fmt.Sprintf(format, args...))}
}

func (e *armError) response() response {
	resp := errorResponse(e.status, e.code, "%s", e.message)
	if e.target != "" {
		resp.body.(errorEnvelope).Error.Target = to.Ptr(e.target)
	}
	return resp
}

func (r *response) set(key, value string) {
	if r.header == nil {
		r.header = http.Header{}
	}
	r.header.Set(key, value)
}

// route is a parsed request path.
type route struct {
	ops      map[string]string // HTTP method -> operation name
	sub      string
	rg, name string
	instance string
	opID     string
}

// routePattern is one served ARM path below /subscriptions/{sub}, as
// segments: literals, matched case-insensitively as in ARM, and
// placeholders, which match any segment: "{rg}", "{name}", "{instance}" and
// "{opID}" are kept in the route, "{location}" is not, and "{action}"
// (last) names a repair action, looked up in actions for the POST
// operation.
type routePattern struct {
	segs    []string
	ops     map[string]string // HTTP method -> operation name; nil with actions
	actions map[string]string // lower-case action -> POST operation
}

// servedRoutes are the served ARM paths, below /subscriptions/{sub}. Read
// only: routes share their ops.
var servedRoutes = []routePattern{
	{segs: pathSegs("resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines"),
		ops: map[string]string{http.MethodGet: OpListVirtualMachines}},
	{segs: pathSegs("resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{instance}/{action}"),
		actions: flexActionOps},
	{segs: pathSegs("providers/Microsoft.Compute/skus"),
		ops: map[string]string{http.MethodGet: OpListSKUs}},
	{segs: pathSegs("providers/Microsoft.Compute/locations/{location}/operations/{opID}"),
		ops: map[string]string{http.MethodGet: OpPollOperation}},
	{segs: pathSegs("resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets"),
		ops: map[string]string{http.MethodGet: OpListScaleSets}},
	{segs: pathSegs("resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}"),
		ops: map[string]string{http.MethodGet: OpGetScaleSet, http.MethodPatch: OpUpdateScaleSet}},
	{segs: pathSegs("resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}/delete"),
		ops: map[string]string{http.MethodPost: OpDeleteInstances}},
	{segs: pathSegs("resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}/virtualMachines"),
		ops: map[string]string{http.MethodGet: OpListVMs}},
	{segs: pathSegs("resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}/virtualMachines/{instance}"),
		ops: map[string]string{http.MethodGet: OpGetVM}},
	{segs: pathSegs("resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}/virtualMachines/{instance}/{action}"),
		actions: actionOps},
}

func pathSegs(path string) []string { return strings.Split(path, "/") }

// match matches the segments after /subscriptions/{sub} and fills in rt.
func (p routePattern) match(segs []string, rt *route) bool {
	if len(segs) != len(p.segs) {
		return false
	}
	for i, want := range p.segs {
		if !p.bind(want, segs[i], rt) {
			return false
		}
	}
	if p.actions == nil {
		rt.ops = p.ops
	}
	return true
}

// bind matches one segment against the pattern's segment want and keeps
// what a placeholder names in rt.
func (p routePattern) bind(want, seg string, rt *route) bool {
	switch want {
	case "{rg}":
		rt.rg = seg
	case "{name}":
		rt.name = seg
	case "{instance}":
		rt.instance = seg
	case "{opID}":
		rt.opID = seg
	case "{location}":
	case "{action}":
		op := p.actions[strings.ToLower(seg)]
		rt.ops = map[string]string{http.MethodPost: op}
		return op != ""
	default:
		return strings.EqualFold(seg, want)
	}
	return true
}

// parseRoute matches an escaped request path against the served ARM paths
// (servedRoutes). Literal segments match case-insensitively, as in ARM.
func parseRoute(escapedPath string) (route, bool) {
	segs := strings.Split(strings.Trim(escapedPath, "/"), "/")
	for i, seg := range segs {
		v, err := url.PathUnescape(seg)
		if err != nil || v == "" {
			return route{}, false
		}
		segs[i] = v
	}
	if len(segs) < 2 || !strings.EqualFold(segs[0], "subscriptions") {
		return route{}, false
	}
	for _, p := range servedRoutes {
		rt := route{sub: segs[1]}
		if p.match(segs[2:], &rt) {
			return rt, true
		}
	}
	return route{}, false
}

// baseURL is the scheme and host the request was sent to, for URLs in
// answers.
func baseURL(r *http.Request) string {
	scheme := "https"
	if r.TLS == nil {
		scheme = "http"
	}
	return scheme + "://" + r.Host
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	resp, deleting := s.handle(r)
	if len(deleting) > 0 {
		// Before the answer: whoever asked cannot act on it before the
		// watcher has looked at the machines.
		s.watcher.VMsDeleting(r.Context(), deleting)
	}
	h := w.Header()
	for k, vs := range resp.header {
		h[k] = vs
	}
	requestID := newUUID()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("x-ms-request-id", requestID)
	h.Set("x-ms-correlation-request-id", requestID)
	if id := r.Header.Get("x-ms-client-request-id"); id != "" {
		h.Set("x-ms-client-request-id", id)
	}
	var body []byte
	if resp.body != nil {
		var err error
		if body, err = json.Marshal(resp.body); err != nil {
			klog.ErrorS(err, "Encoding ARM response failed", "method", r.Method, "path", r.URL.Path)
			resp.status = http.StatusInternalServerError
			body = []byte(`{"error":{"code":"InternalServerError","message":"encoding the response failed"}}`)
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(resp.status)
	if _, err := w.Write(body); err != nil {
		klog.V(4).InfoS("Writing ARM response failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	klog.V(4).InfoS("ARM request", "method", r.Method, "url", r.URL.String(), "status", resp.status, "requestID", requestID)
}

// handle answers a request and, when there is a DeletionWatcher, returns the
// VMs the request started deleting.
func (s *Server) handle(r *http.Request) (response, []VM) {
	var body []byte
	if r.Method == http.MethodPatch || r.Method == http.MethodPost || r.Method == http.MethodPut {
		var err error
		if body, err = io.ReadAll(io.LimitReader(r.Body, maxBody)); err != nil {
			return errorResponse(http.StatusBadRequest, "InvalidRequestContent", "Reading the request body failed: %v", err), nil
		}
	}
	kind := kindOf(r.Method)
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	s.recordDeleting, s.deleting = s.watcher != nil, nil
	resp := s.route(r, kind, body, now)
	deleting := s.startedDeleting()
	if kind != kindRead {
		s.logWrite(r, body, resp.status, now)
	}
	s.armHeaders(&resp, kind, CallerOf(token), now)
	return resp, deleting
}

// route checks, throttles (ARM's buckets, then the Compute policies:
// throttle.go), counts and dispatches a request. Callers hold s.mu.
func (s *Server) route(r *http.Request, kind string, body []byte, now time.Time) response {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return errorResponse(http.StatusUnauthorized, "AuthenticationFailed",
			"Authentication failed. The 'Authorization' header is missing or is not a bearer token.")
	}
	if r.URL.Query().Get("api-version") == "" {
		return errorResponse(http.StatusBadRequest, "MissingApiVersionParameter",
			"The api-version query parameter (?api-version=) is required for all requests.")
	}
	rt, ok := parseRoute(r.URL.EscapedPath())
	if !ok {
		return errorResponse(http.StatusNotFound, "NotFound", "The simulator does not serve the path '%s'.", r.URL.Path)
	}
	op, ok := rt.ops[r.Method]
	if !ok {
		return errorResponse(http.StatusMethodNotAllowed, "MethodNotAllowed",
			"The requested method '%s' is not allowed on '%s'.", r.Method, r.URL.Path)
	}
	if !strings.EqualFold(rt.sub, s.opts.SubscriptionID) {
		return errorResponse(http.StatusNotFound, "SubscriptionNotFound", "The subscription '%s' could not be found.", rt.sub)
	}
	if resp, throttled := s.admitARM(kind, CallerOf(token), now); throttled {
		s.calls[OpThrottled]++
		return resp
	}
	charges := s.computeCharges(r, rt, op, body)
	if resp, throttled := s.admitCompute(charges, now); throttled {
		s.calls[OpThrottled]++
		return resp
	}
	s.calls[op]++
	resp := s.dispatch(r, rt, op, body, now)
	s.computeHeaders(&resp, charges, now)
	return resp
}

// dispatch answers an admitted request. Callers hold s.mu.
func (s *Server) dispatch(r *http.Request, rt route, op string, body []byte, now time.Time) response {
	if resp, ok := s.dispatchUnscoped(r, rt, op, now); ok {
		return resp
	}
	set, errResp := s.resolveSet(rt, now)
	if errResp != nil {
		return *errResp
	}
	if resp := s.refuseSetOp(r, set, op); resp != nil {
		return *resp
	}
	return s.dispatchSetOp(r, rt, set, op, body, now)
}

// dispatchUnscoped answers the requests that are not about one scale set
// named in their path, and says whether op is one. Callers hold s.mu.
func (s *Server) dispatchUnscoped(r *http.Request, rt route, op string, now time.Time) (response, bool) {
	switch op {
	case OpListSKUs:
		return s.listSKUs(r), true
	case OpPollOperation:
		return s.pollOperation(r, rt, now), true
	case OpListScaleSets:
		return s.listScaleSets(rt, now), true
	case OpListVirtualMachines:
		return s.listVirtualMachines(r, rt, now), true
	case OpRestartVirtualMachine, OpReimageVirtualMachine, OpRedeployVirtualMachine:
		return s.flexVMAction(r, rt, op, now), true
	}
	return response{}, false
}

// refuseSetOp answers a request about the set that the set refuses, or
// returns nil: scale-set VM requests to a Flexible set, and writes that
// refuseWrite refuses. Callers hold s.mu.
func (s *Server) refuseSetOp(r *http.Request, set *scaleSet, op string) *response {
	if set.flexible && (op == OpListVMs || op == OpGetVM || actionOps[actionOf(op)] == op) {
		// A Flexible scale set's VMs are virtual machines of their own.
		resp := errorResponse(http.StatusBadRequest, "OperationNotAllowed",
			"Operation 'VirtualMachineScaleSets.virtualMachines.GET' is not allowed on Virtual Machine Scale Set '%s'.", set.name)
		return &resp
	}
	if op == OpUpdateScaleSet || op == OpDeleteInstances {
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		return s.refuseWrite(set, op, CallerOf(token))
	}
	return nil
}

// dispatchSetOp answers an admitted request about the set. Callers hold
// s.mu.
func (s *Server) dispatchSetOp(r *http.Request, rt route, set *scaleSet, op string, body []byte, now time.Time) response {
	switch op {
	case OpGetScaleSet:
		return response{status: http.StatusOK, body: s.scaleSetModel(set, set.provisioningState(now))}
	case OpUpdateScaleSet:
		return s.updateScaleSet(r, set, body, now)
	case OpDeleteInstances:
		return s.deleteScaleSetInstances(r, set, body, now)
	case OpListVMs:
		return s.listVMs(r, set, now)
	case OpGetVM:
		return s.getVM(r, set, rt.instance)
	case OpRestartVM, OpReimageVM, OpRedeployVM:
		return s.vmAction(r, set, rt.instance, actionOf(op), now)
	}
	return errorResponse(http.StatusInternalServerError, "InternalServerError", "Unhandled operation %s.", op)
}

// resolveSet finds the scale set a request is about, lands the late
// updates due (FaultCommitLate) and applies FaultServerError. Callers hold
// s.mu.
func (s *Server) resolveSet(rt route, now time.Time) (*scaleSet, *response) {
	if !s.groupExists(rt.rg) {
		resp := errorResponse(http.StatusNotFound, "ResourceGroupNotFound", "Resource group '%s' could not be found.", rt.rg)
		return nil, &resp
	}
	set, ok := s.sets[setKey(rt.rg, rt.name)]
	if !ok {
		resp := errorResponse(http.StatusNotFound, "ResourceNotFound",
			"The Resource 'Microsoft.Compute/virtualMachineScaleSets/%s' under resource group '%s' was not found. "+
				"For more details please go to https://aka.ms/ARMResourceNotFoundFix", rt.name, rt.rg)
		return nil, &resp
	}
	if resp := s.aboutSet(set, now); resp != nil {
		return nil, resp
	}
	return set, nil
}

// aboutSet is called for each request about a scale set: it lands the
// late updates due (FaultCommitLate) and applies FaultServerError. Callers
// hold s.mu.
func (s *Server) aboutSet(set *scaleSet, now time.Time) *response {
	s.landLate(set, false, now)
	if _, ok := set.takeFault(FaultServerError); ok {
		resp := errorResponse(http.StatusInternalServerError, "InternalServerError",
			"Encountered internal server error. Diagnostic information: tracking id '%s'.", newUUID())
		return &resp
	}
	return nil
}

func (s *Server) listScaleSets(rt route, now time.Time) response {
	if !s.groupExists(rt.rg) {
		return errorResponse(http.StatusNotFound, "ResourceGroupNotFound", "Resource group '%s' could not be found.", rt.rg)
	}
	prefix := strings.ToLower(rt.rg) + "/"
	list := armcompute.VirtualMachineScaleSetListResult{Value: []*armcompute.VirtualMachineScaleSet{}}
	for key, set := range s.sets {
		if strings.HasPrefix(key, prefix) {
			s.landLate(set, false, now)
			list.Value = append(list.Value, s.scaleSetModel(set, set.provisioningState(now)))
		}
	}
	slices.SortFunc(list.Value, func(a, b *armcompute.VirtualMachineScaleSet) int { return strings.Compare(*a.Name, *b.Name) })
	return response{status: http.StatusOK, body: list}
}

// updateRequest is what a PATCH of a scale set asks for.
type updateRequest struct {
	ifMatch, ifNoneMatch string
	skuName              string
	capacity             *int
	tags                 map[string]string // nil: unchanged
}

func (s *Server) updateScaleSet(r *http.Request, set *scaleSet, body []byte, now time.Time) response {
	p, errResp := parseUpdate(r, body)
	if errResp != nil {
		return *errResp
	}
	if s.acceptLate(set, p) {
		return errorResponse(http.StatusInternalServerError, "InternalServerError",
			"Encountered internal server error. Diagnostic information: tracking id '%s'.", newUUID())
	}
	op, aerr := s.update(set, p, now)
	if aerr != nil {
		return aerr.response()
	}
	if _, ok := set.takeFault(FaultCommitThenServerError); ok {
		return errorResponse(http.StatusInternalServerError, "InternalServerError",
			"Encountered internal server error. Diagnostic information: tracking id '%s'.", newUUID())
	}
	// ARM answers the PATCH while the update is under way.
	resp := response{status: http.StatusOK, body: s.scaleSetModel(set, "Updating")}
	resp.set("Azure-AsyncOperation", s.operationURL(r, op.id, false))
	return resp
}

// parseUpdate reads a scale set PATCH: its body and conditional headers,
// or the answer to a body that is not valid.
func parseUpdate(r *http.Request, body []byte) (updateRequest, *response) {
	var upd armcompute.VirtualMachineScaleSetUpdate
	if err := unmarshalBody(body, &upd); err != nil {
		resp := errorResponse(http.StatusBadRequest, "InvalidRequestContent", "The request content was invalid and could not be deserialized: %v", err)
		return updateRequest{}, &resp
	}
	p := updateRequest{ifMatch: r.Header.Get("If-Match"), ifNoneMatch: r.Header.Get("If-None-Match")}
	if upd.SKU != nil {
		if upd.SKU.Name != nil {
			p.skuName = *upd.SKU.Name
		}
		if c := upd.SKU.Capacity; c != nil {
			if *c < 0 || *c > maxCapacity {
				resp := capacityOutOfRange(int(*c)).response()
				return updateRequest{}, &resp
			}
			p.capacity = new(int(*c))
		}
	}
	p.tags = updatedTags(upd.Tags)
	return p, nil
}

// updatedTags are the tags a PATCH sets (a null value is ""), nil when it
// leaves them unchanged.
func updatedTags(tags map[string]*string) map[string]string {
	if tags == nil {
		return nil
	}
	out := make(map[string]string, len(tags))
	for k, v := range tags {
		if v != nil {
			out[k] = *v
		} else {
			out[k] = ""
		}
	}
	return out
}

func (s *Server) deleteScaleSetInstances(r *http.Request, set *scaleSet, body []byte, now time.Time) response {
	force := false
	if v := r.URL.Query().Get("forceDeletion"); v != "" {
		var err error
		if force, err = strconv.ParseBool(v); err != nil {
			return errorResponse(http.StatusBadRequest, "InvalidParameter", "The value '%s' of query parameter 'forceDeletion' is not a boolean.", v)
		}
	}
	var req armcompute.VirtualMachineScaleSetVMInstanceRequiredIDs
	if err := unmarshalBody(body, &req); err != nil {
		return errorResponse(http.StatusBadRequest, "InvalidRequestContent", "The request content was invalid and could not be deserialized: %v", err)
	}
	var ids []string
	for _, id := range req.InstanceIDs {
		if id != nil {
			ids = append(ids, *id)
		}
	}
	op, aerr := s.deleteInstances(set, ids, force, now)
	if aerr != nil {
		return aerr.response()
	}
	resp := response{status: http.StatusAccepted}
	resp.set("Location", s.operationURL(r, op.id, true))
	resp.set("Azure-AsyncOperation", s.operationURL(r, op.id, false))
	return resp
}

func unmarshalBody(body []byte, v any) error {
	if len(body) == 0 {
		return fmt.Errorf("the request body is empty")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("decoding the request body: %w", err)
	}
	return nil
}

// operationURL is the URL of an operation: the Azure-AsyncOperation form, or
// with monitor the Location form.
func (s *Server) operationURL(r *http.Request, opID string, monitor bool) string {
	q := "api-version=" + operationAPIVersion
	if monitor {
		q = "monitor=true&" + q
	}
	return fmt.Sprintf("%s/subscriptions/%s/providers/Microsoft.Compute/locations/%s/operations/%s?%s",
		baseURL(r), url.PathEscape(s.opts.SubscriptionID), url.PathEscape(s.opts.Location), url.PathEscape(opID), q)
}

func (s *Server) pollOperation(r *http.Request, rt route, now time.Time) response {
	op, ok := s.ops[rt.opID]
	if !ok {
		return errorResponse(http.StatusNotFound, "NotFound", "The operation '%s' was not found.", rt.opID)
	}
	if !strings.EqualFold(r.URL.Query().Get("monitor"), "true") {
		return response{status: http.StatusOK, body: op.statusBody(now)}
	}
	switch {
	case !op.done(now):
		resp := response{status: http.StatusAccepted}
		resp.set("Location", s.operationURL(r, op.id, true))
		return resp
	case op.errCode != "":
		return errorResponse(http.StatusInternalServerError, op.errCode, "%s", op.errMessage)
	}
	return response{status: http.StatusOK}
}

func (s *Server) listVMs(r *http.Request, set *scaleSet, now time.Time) response {
	expand := strings.EqualFold(r.URL.Query().Get("$expand"), "instanceView")
	vms := set.sortedVMs()
	start, end, next, errResp := s.pageOf(r, len(vms))
	if errResp != nil {
		return *errResp
	}
	page := armcompute.VirtualMachineScaleSetVMListResult{Value: make([]*armcompute.VirtualMachineScaleSetVM, 0, end-start), NextLink: next}
	_, blank := set.takeFault(FaultDeletingWithoutIDs)
	for _, vm := range vms[start:end] {
		m := s.vmModel(vm, expand)
		if blank && vm.state == StateDeleting {
			m.ID, m.InstanceID = to.Ptr(""), to.Ptr("")
		}
		page.Value = append(page.Value, m)
	}
	return response{status: http.StatusOK, body: page}
}

// pageOf returns the items [start, end) of n on the page the request asks
// for ($skiptoken) and the next page's link, or the answer to a bad token.
func (s *Server) pageOf(r *http.Request, n int) (start, end int, next *string, errResp *response) {
	q := r.URL.Query()
	if tok := q.Get("$skiptoken"); tok != "" {
		v, err := strconv.Atoi(tok)
		if err != nil || v < 0 {
			resp := errorResponse(http.StatusBadRequest, "InvalidParameter", "The value '%s' of parameter '$skiptoken' is invalid.", tok)
			return 0, 0, nil, &resp
		}
		start = min(v, n)
	}
	end = min(start+s.opts.PageSize, n)
	if end < n {
		q.Set("$skiptoken", strconv.Itoa(end))
		link := baseURL(r) + r.URL.EscapedPath() + "?" + q.Encode()
		next = &link
	}
	return start, end, next, nil
}

// scaleSetFilter matches the one filter the Virtual Machines List API
// takes, with or without quotes around the property:
// 'virtualMachineScaleSet/id' eq '<scale set resource ID>'.
var scaleSetFilter = regexp.MustCompile(`(?i)^\s*'?virtualMachineScaleSet/id'?\s+eq\s+'([^']*)'\s*$`)

// listVirtualMachines answers the Virtual Machines List API of a resource
// group as ARM does for the VMs of Flexible scale sets: every one without
// a filter, one scale set's with 'virtualMachineScaleSet/id' eq '<id>'
// (none for a Uniform scale set, whose VMs are not virtual machines of
// their own), and $expand=instanceView only together with that filter. A
// filtered list is a request about the scale set (faults, late updates)
// and, with instance view, a high-cost read of it charged as the
// scale-set VM list is (computeCharges). Callers hold
// s.mu.
func (s *Server) listVirtualMachines(r *http.Request, rt route, now time.Time) response {
	q := r.URL.Query()
	if !s.groupExists(rt.rg) {
		return errorResponse(http.StatusNotFound, "ResourceGroupNotFound", "Resource group '%s' could not be found.", rt.rg)
	}
	filter, expand := q.Get("$filter"), q.Get("$expand")
	if resp := checkListExpand(filter, expand); resp != nil {
		return *resp
	}
	var vms []*vmRecord
	if filter != "" {
		var errResp *response
		if vms, errResp = s.filteredVMs(filter, rt, now); errResp != nil {
			return *errResp
		}
	} else {
		vms = s.groupFlexibleVMs(rt.rg)
	}
	start, end, next, errResp := s.pageOf(r, len(vms))
	if errResp != nil {
		return *errResp
	}
	page := armcompute.VirtualMachineListResult{Value: s.virtualMachineModels(vms[start:end], expand != ""), NextLink: next}
	return response{status: http.StatusOK, body: page}
}

// checkListExpand answers a Virtual Machines list's $expand that is not
// instanceView, or is without a $filter; nil when it is fine.
func checkListExpand(filter, expand string) *response {
	if expand != "" && !strings.EqualFold(expand, string(armcompute.ExpandTypeForListVMsInstanceView)) {
		resp := errorResponse(http.StatusBadRequest, "InvalidParameter",
			"The value '%s' of parameter '$expand' is not valid. The allowed value is 'instanceView'.", expand)
		return &resp
	}
	if expand != "" && filter == "" {
		// The API's documented rule; the wording of the message is the
		// simulator's.
		resp := errorResponse(http.StatusBadRequest, "InvalidParameter",
			"The parameter '$expand' with value 'instanceView' can only be specified together with a valid '$filter'.")
		return &resp
	}
	return nil
}

// filteredVMs are the VMs of the Flexible scale set the filter names, if
// it is in the subscription and the request's resource group (none for a
// Uniform one), or the answer to a filter that is not valid, or to the
// request about the scale set (aboutSet). Callers hold s.mu.
func (s *Server) filteredVMs(filter string, rt route, now time.Time) ([]*vmRecord, *response) {
	m := scaleSetFilter.FindStringSubmatch(filter)
	if m == nil {
		resp := errorResponse(http.StatusBadRequest, "InvalidParameter",
			"The value '%s' of parameter '$filter' is not valid. The allowed value is \"'virtualMachineScaleSet/id' eq '<scale set resource ID>'\".", filter)
		return nil, &resp
	}
	sub, rg, name, ok := parseScaleSetID(m[1])
	if !ok {
		resp := errorResponse(http.StatusBadRequest, "InvalidParameter",
			"The value '%s' in parameter '$filter' is not a virtual machine scale set resource ID.", m[1])
		return nil, &resp
	}
	set, found := s.sets[setKey(rg, name)]
	if !found || !strings.EqualFold(sub, s.opts.SubscriptionID) || !strings.EqualFold(rg, rt.rg) {
		return nil, nil
	}
	if resp := s.aboutSet(set, now); resp != nil {
		return nil, resp
	}
	if set.flexible {
		return set.sortedVMs(), nil
	}
	return nil, nil
}

// groupFlexibleVMs are the VMs of the resource group's Flexible scale
// sets, by scale set name and instance ID. Callers hold s.mu.
func (s *Server) groupFlexibleVMs(rg string) []*vmRecord {
	var vms []*vmRecord
	prefix := strings.ToLower(rg) + "/"
	for key, set := range s.sets {
		if strings.HasPrefix(key, prefix) && set.flexible {
			vms = append(vms, set.sortedVMs()...)
		}
	}
	slices.SortFunc(vms, func(a, b *vmRecord) int {
		return cmp.Or(strings.Compare(a.set.name, b.set.name), a.instanceID-b.instanceID)
	})
	return vms
}

// virtualMachineModels are a page of the Virtual Machines list, applying
// FaultDeletingWithoutIDs once per scale set on the page. Callers hold
// s.mu.
func (s *Server) virtualMachineModels(vms []*vmRecord, instanceView bool) []*armcompute.VirtualMachine {
	models := make([]*armcompute.VirtualMachine, 0, len(vms))
	blank := map[*scaleSet]bool{}
	for _, vm := range vms {
		m := s.virtualMachineModel(vm, instanceView)
		b, seen := blank[vm.set]
		if !seen {
			_, b = vm.set.takeFault(FaultDeletingWithoutIDs)
			blank[vm.set] = b
		}
		if b && vm.state == StateDeleting {
			m.ID = to.Ptr("")
		}
		models = append(models, m)
	}
	return models
}

// parseScaleSetID parses
// /subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<name>,
// literal segments in any case.
func parseScaleSetID(id string) (sub, rg, name string, ok bool) {
	p := strings.Split(strings.Trim(id, "/"), "/")
	if len(p) != 8 || !strings.EqualFold(p[0], "subscriptions") || !strings.EqualFold(p[2], "resourceGroups") ||
		!strings.EqualFold(p[4], "providers") || !strings.EqualFold(p[5], "Microsoft.Compute") ||
		!strings.EqualFold(p[6], "virtualMachineScaleSets") || p[1] == "" || p[3] == "" || p[7] == "" {
		return "", "", "", false
	}
	return p[1], p[3], p[7], true
}

func (s *Server) getVM(r *http.Request, set *scaleSet, instance string) response {
	vm, ok := set.vmByKey(instance)
	if !ok {
		return errorResponse(http.StatusNotFound, "ResourceNotFound",
			"The Resource 'Microsoft.Compute/virtualMachineScaleSets/%s/virtualMachines/%s' under resource group '%s' was not found.",
			set.name, instance, set.rg)
	}
	expand := strings.EqualFold(r.URL.Query().Get("$expand"), "instanceView")
	return response{status: http.StatusOK, body: s.vmModel(vm, expand)}
}

var locationFilter = regexp.MustCompile(`(?i)^\s*location\s+eq\s+'([^']*)'\s*$`)

func (s *Server) listSKUs(r *http.Request) response {
	location := ""
	if f := r.URL.Query().Get("$filter"); f != "" {
		m := locationFilter.FindStringSubmatch(f)
		if m == nil {
			return errorResponse(http.StatusBadRequest, "InvalidParameter",
				"The filter '%s' is not supported; only \"location eq '<location>'\" is.", f)
		}
		location = m[1]
	}
	list := armcompute.ResourceSKUsResult{Value: []*armcompute.ResourceSKU{}}
	if location == "" || strings.EqualFold(location, s.opts.Location) {
		for _, k := range s.opts.SKUs {
			list.Value = append(list.Value, k.resourceSKU(s.opts.Location))
		}
	}
	return response{status: http.StatusOK, body: list}
}
