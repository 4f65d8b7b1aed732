package cost

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"
)

// maxSelectionNesting bounds how deeply the walker recurses through
// selection sets, inline fragments and fragment spreads together, whatever
// MaxDepth says about fields: a chain of fragments that only spread each
// other nests without adding fields.
const maxSelectionNesting = 512

// acc is the cost of a selection, in every model at once: the formulas have
// the same shape and differ only in weights, so one walk serves all.
type acc struct {
	fields   int64 // Σ weight + size × fields(selection)
	requests int64 // GitHub: Σ over connections of 1 + size × requests(selection)
	nodes    int64 // GitHub: Σ over connections of size × (1 + nodes(selection))
	depth    int   // deepest field, relative to where the walk started
	// scaled is fields with each field's weight multiplied by
	// DepthFactor^(level−1), level counted from the walk's start (1 for
	// its own fields); kept only when a DepthFactor is set.
	scaled float64
	top    int64 // the fields of the selection itself (through fragments), __typename aside
}

func (a *acc) add(b acc) {
	a.fields = satAdd(a.fields, b.fields)
	a.requests = satAdd(a.requests, b.requests)
	a.nodes = satAdd(a.nodes, b.nodes)
	a.depth = max(a.depth, b.depth)
	a.scaled += b.scaled
	a.top = satAdd(a.top, b.top)
}

// mulScaled is a × b for scaled costs, where a size of 0 wins over an
// infinite cost (0 × +Inf would be NaN).
func mulScaled(a, b float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return a * b
}

type fragState struct {
	def      *ast.FragmentDefinition
	visiting bool
	done     bool
	res      acc
}

// walker costs one operation of one document.
type walker struct {
	g          *GraphQL
	op         *ast.OperationDefinition
	frags      map[string]*fragState
	rawVars    []byte
	vars       map[string]int64 // integer variables, parsed on first use
	varsParsed bool

	maxDepth, maxAliases, maxDirectives int
	slicing                             []string
	defaultSize                         int64
	factor                              float64 // DepthFactor, 0 when off

	aliases, directives int
	nesting             int
}

func newWalker(g *GraphQL, doc *ast.QueryDocument, op *ast.OperationDefinition, vars []byte) *walker {
	w := &walker{
		g:             g,
		op:            op,
		rawVars:       vars,
		maxDepth:      int(orDefault(int64(g.MaxDepth), DefaultGraphQLMaxDepth)),
		maxAliases:    int(orDefault(int64(g.MaxAliases), DefaultGraphQLMaxAliases)),
		maxDirectives: int(orDefault(int64(g.MaxDirectives), DefaultGraphQLMaxDirectives)),
		slicing:       g.SlicingArguments,
		defaultSize:   orDefault(g.DefaultListSize, DefaultGraphQLListSize),
	}
	if g.DepthFactor > 1 {
		w.factor = g.DepthFactor
	}
	if len(w.slicing) == 0 {
		w.slicing = []string{"first", "last"}
	}
	if len(doc.Fragments) > 0 {
		w.frags = make(map[string]*fragState, len(doc.Fragments))
		for _, f := range doc.Fragments {
			if _, dup := w.frags[f.Name]; !dup {
				w.frags[f.Name] = &fragState{def: f}
			}
		}
	}
	return w
}

func (w *walker) operation() (acc, error) {
	if err := w.countDirectives(len(w.op.Directives)); err != nil {
		return acc{}, err
	}
	root := ""
	if s := w.g.schema; s != nil {
		root = s.rootType(w.op.Operation)
	}
	return w.selectionSet(w.op.SelectionSet, root, 0)
}

func (w *walker) countDirectives(n int) error {
	w.directives += n
	if w.directives > w.maxDirectives {
		return inputErr(TypeGraphQLTooManyDirs, "Too many GraphQL directives", "the query uses more than %d directives", w.maxDirectives)
	}
	return nil
}

func (w *walker) tooDeep() error {
	return inputErr(TypeGraphQLTooDeep, "GraphQL query too deep", "fields nest more than %d levels", w.maxDepth)
}

// selectionSet costs set, whose fields belong to type parent ("" when
// unknown), found at field depth depth.
func (w *walker) selectionSet(set ast.SelectionSet, parent string, depth int) (acc, error) {
	w.nesting++
	defer func() { w.nesting-- }()
	if w.nesting > maxSelectionNesting {
		return acc{}, w.tooDeep()
	}
	var total acc
	total.depth = depth
	for _, sel := range set {
		var a acc
		var err error
		switch s := sel.(type) {
		case *ast.Field:
			a, err = w.field(s, parent, depth)
		case *ast.InlineFragment:
			if err = w.countDirectives(len(s.Directives)); err != nil {
				return acc{}, err
			}
			typ := parent
			if s.TypeCondition != "" {
				typ = s.TypeCondition
			}
			a, err = w.selectionSet(s.SelectionSet, typ, depth)
		case *ast.FragmentSpread:
			if err = w.countDirectives(len(s.Directives)); err != nil {
				return acc{}, err
			}
			a, err = w.spread(s.Name, depth)
		}
		if err != nil {
			return acc{}, err
		}
		total.add(a)
	}
	return total, nil
}

// spread costs a fragment spread. Each fragment is walked once, from depth
// 0, and its cost reused at every spread: costs do not depend on where a
// fragment is spread (its type condition fixes its parent type, and the
// variables are the operation's), only its depth does, by an offset.
func (w *walker) spread(name string, depth int) (acc, error) {
	st := w.frags[name]
	if st == nil {
		return acc{}, inputErr(TypeGraphQLUnknownFrag, "Unknown GraphQL fragment", "fragment %q is not defined", name)
	}
	if st.visiting {
		return acc{}, inputErr(TypeGraphQLFragmentCycle, "GraphQL fragment cycle", "fragment %q spreads itself", name)
	}
	if !st.done {
		st.visiting = true
		if err := w.countDirectives(len(st.def.Directives)); err != nil {
			return acc{}, err
		}
		res, err := w.selectionSet(st.def.SelectionSet, st.def.TypeCondition, 0)
		if err != nil {
			return acc{}, err
		}
		st.visiting, st.done, st.res = false, true, res
	}
	res := st.res
	res.depth += depth
	if res.depth > w.maxDepth {
		return acc{}, w.tooDeep()
	}
	if w.factor != 0 && depth > 0 {
		// Every field of the fragment sits depth levels deeper than in
		// its own walk: each weight is multiplied by factor^depth.
		res.scaled = mulScaled(res.scaled, math.Pow(w.factor, float64(depth)))
	}
	return res, nil
}

func (w *walker) field(f *ast.Field, parent string, depth int) (acc, error) {
	depth++
	if depth > w.maxDepth {
		return acc{}, w.tooDeep()
	}
	if f.Alias != "" && f.Alias != f.Name {
		w.aliases++
		if w.aliases > w.maxAliases {
			return acc{}, inputErr(TypeGraphQLTooManyAliases, "Too many GraphQL aliases", "the query uses more than %d aliases", w.maxAliases)
		}
	}
	if err := w.countDirectives(len(f.Directives)); err != nil {
		return acc{}, err
	}
	if f.Name == "__typename" {
		return acc{depth: depth}, nil
	}

	var info *fieldInfo
	if s := w.g.schema; s != nil {
		info = s.field(parent, f.Name)
	}
	weight := int64(1)
	childType := ""
	if info != nil {
		childType = info.typeName
		if w.g.Model != ModelGitHub {
			weight = info.weight
			for _, a := range f.Arguments {
				weight = satAdd(weight, info.argWeights[a.Name])
			}
		}
	}
	size, isList := w.size(f, info)

	child, err := w.selectionSet(f.SelectionSet, childType, depth)
	if err != nil {
		return acc{}, err
	}
	res := acc{depth: max(depth, child.depth), top: 1}
	if isList {
		res.fields = satAdd(weight, satMul(size, child.fields))
		res.requests = satAdd(1, satMul(size, child.requests))
		res.nodes = satMul(size, satAdd(1, child.nodes))
	} else {
		res.fields = satAdd(weight, child.fields)
		res.requests = child.requests
		res.nodes = child.nodes
	}
	if w.factor != 0 {
		// The field's own weight at its level (depth is 1 at the top of
		// this walk), its selection already scaled at theirs.
		own := mulScaled(float64(weight), math.Pow(w.factor, float64(depth-1)))
		if isList {
			res.scaled = own + mulScaled(float64(size), child.scaled)
		} else {
			res.scaled = own + child.scaled
		}
	}
	return res, nil
}

// size returns a field's list size and whether it is a list at all.
func (w *walker) size(f *ast.Field, info *fieldInfo) (int64, bool) {
	slicing := w.slicing
	var assumed int64 = -1
	if info != nil && info.listSize != nil {
		if len(info.listSize.slicing) > 0 {
			slicing = info.listSize.slicing
		}
		assumed = info.listSize.assumed
	}
	found, resolved := false, false
	var size int64
	for _, a := range f.Arguments {
		if !contains(slicing, a.Name) {
			continue
		}
		found = true
		if v, ok := w.intValue(a.Value); ok {
			resolved = true
			size = max(size, v)
		}
	}
	switch {
	case resolved:
		return size, true
	case assumed >= 0:
		return assumed, true
	case found, info != nil && info.isList, info == nil && w.g.isListField(f.Name):
		return w.defaultSize, true
	}
	return 1, false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// intValue resolves an argument to a non-negative integer: a literal, or a
// variable from the request, else the variable's default value.
func (w *walker) intValue(v *ast.Value) (int64, bool) {
	if v == nil {
		return 0, false
	}
	switch v.Kind {
	case ast.IntValue:
		return parseSize(v.Raw)
	case ast.Variable:
		if n, ok := w.variable(v.Raw); ok {
			return max(n, 0), true
		}
		for _, d := range w.op.VariableDefinitions {
			if d.Variable == v.Raw && d.DefaultValue != nil && d.DefaultValue.Kind == ast.IntValue {
				return parseSize(d.DefaultValue.Raw)
			}
		}
	}
	return 0, false
}

// parseSize parses an integer literal, saturating huge values and treating
// negative ones as 0 (the server will reject them anyway).
func parseSize(raw string) (int64, bool) {
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			if len(raw) > 0 && raw[0] == '-' {
				return 0, true
			}
			return math.MaxInt64, true
		}
		return 0, false
	}
	return max(n, 0), true
}

// variable returns an integer variable of the request.
func (w *walker) variable(name string) (int64, bool) {
	if !w.varsParsed {
		w.varsParsed = true
		w.vars = parseIntVars(w.rawVars)
	}
	n, ok := w.vars[name]
	return n, ok
}

// parseIntVars returns the members of a variables object that a server
// may read as an Int: integers, and also what common servers coerce to one
// — a number written as 100.0 or 1e2 (graphql-js, graphql-ruby) or a
// numeric string "100" (gqlgen) — so that spelling a size differently never
// makes it cheaper. A fraction counts rounded up, a negative size as 0.
// Anything malformed yields no variables: sizes then fall back to the
// defaults.
func parseIntVars(raw []byte) map[string]int64 {
	c := &jsonCursor{b: raw}
	if c.peek() != '{' {
		return nil
	}
	vars := map[string]int64{}
	err := c.object(func(key []byte) error {
		switch c.peek() {
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			span, err := c.span()
			if n, ok := sizeOf(string(span)); ok && err == nil {
				vars[string(key)] = n
			}
			return err
		case '"':
			raw, esc, err := c.str()
			if esc {
				raw = unescapeJSON(nil, raw) // "\u0031\u0030\u0030" is "100" too
			}
			if err == nil {
				if n, ok := sizeOf(strings.TrimSpace(string(raw))); ok {
					vars[string(key)] = n
				}
			}
			return err
		}
		return c.skip()
	})
	if err != nil {
		return nil
	}
	return vars
}

// sizeOf reads a number as a list size: exact for integers, rounded up for
// other finite numbers, saturated at MaxInt64, 0 when negative.
func sizeOf(s string) (int64, bool) {
	if n, ok := parseSize(s); ok {
		return n, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || math.IsNaN(f) {
		return 0, false
	}
	switch {
	case f <= 0:
		return 0, true
	case f >= math.MaxInt64:
		return math.MaxInt64, true
	}
	return int64(math.Ceil(f)), true
}

// schemaIndex holds what the walker needs from a schema: per type and field,
// the weight, the list size rules and the type the field returns.
type schemaIndex struct {
	types                         map[string]map[string]*fieldInfo
	query, mutation, subscription string
}

type fieldInfo struct {
	typeName   string // named type the field returns
	isList     bool
	weight     int64
	argWeights map[string]int64
	listSize   *listSize
}

type listSize struct {
	assumed int64 // -1 when not given
	slicing []string
}

func (s *schemaIndex) rootType(op ast.Operation) string {
	switch op {
	case ast.Mutation:
		return s.mutation
	case ast.Subscription:
		return s.subscription
	}
	return s.query
}

func (s *schemaIndex) field(parent, name string) *fieldInfo {
	return s.types[parent][name]
}

// indexSchema parses SDL and indexes its @cost and @listSize directives. It
// does not validate the schema (the upstream does): directives need not be
// declared, and unknown types simply have no weights.
func indexSchema(sdl string) (*schemaIndex, error) {
	doc, err := parser.ParseSchema(&ast.Source{Name: "schema", Input: sdl})
	if err != nil {
		return nil, err
	}
	idx := &schemaIndex{
		types:        map[string]map[string]*fieldInfo{},
		query:        "Query",
		mutation:     "Mutation",
		subscription: "Subscription",
	}
	for _, list := range []ast.SchemaDefinitionList{doc.Schema, doc.SchemaExtension} {
		for _, sd := range list {
			for _, ot := range sd.OperationTypes {
				switch ot.Operation {
				case ast.Query:
					idx.query = ot.Type
				case ast.Mutation:
					idx.mutation = ot.Type
				case ast.Subscription:
					idx.subscription = ot.Type
				}
			}
		}
	}
	defs := append(append(ast.DefinitionList{}, doc.Definitions...), doc.Extensions...)

	// Type-level weights first: a field inherits its return type's weight.
	typeWeight := map[string]int64{}
	for _, d := range defs {
		if w, ok, err := costWeight(d.Directives); err != nil {
			return nil, fmt.Errorf("type %s: %w", d.Name, err)
		} else if ok {
			typeWeight[d.Name] = w
		}
	}
	for _, d := range defs {
		if d.Kind != ast.Object && d.Kind != ast.Interface {
			continue
		}
		fields := idx.types[d.Name]
		if fields == nil {
			fields = map[string]*fieldInfo{}
			idx.types[d.Name] = fields
		}
		for _, fd := range d.Fields {
			info := &fieldInfo{typeName: fd.Type.Name(), isList: isListType(fd.Type), weight: 1}
			if w, ok := typeWeight[info.typeName]; ok {
				info.weight = w
			}
			w, ok, err := costWeight(fd.Directives)
			if err != nil {
				return nil, fmt.Errorf("field %s.%s: %w", d.Name, fd.Name, err)
			}
			if ok {
				info.weight = w
			}
			for _, ad := range fd.Arguments {
				w, ok, err := costWeight(ad.Directives)
				if err != nil {
					return nil, fmt.Errorf("argument %s.%s(%s): %w", d.Name, fd.Name, ad.Name, err)
				}
				if ok {
					if info.argWeights == nil {
						info.argWeights = map[string]int64{}
					}
					info.argWeights[ad.Name] = w
				}
			}
			ls, err := listSizeOf(fd.Directives)
			if err != nil {
				return nil, fmt.Errorf("field %s.%s: %w", d.Name, fd.Name, err)
			}
			info.listSize = ls
			fields[fd.Name] = info
		}
	}
	return idx, nil
}

func isListType(t *ast.Type) bool {
	return t != nil && t.Elem != nil
}

// costWeight reads @cost(weight: …): an Int, or a String holding one (the
// IBM specification writes weights as strings).
func costWeight(dirs ast.DirectiveList) (int64, bool, error) {
	d := dirs.ForName("cost")
	if d == nil {
		return 0, false, nil
	}
	a := d.Arguments.ForName("weight")
	if a == nil || a.Value == nil {
		return 0, false, fmt.Errorf("@cost needs a weight")
	}
	n, err := strconv.ParseInt(a.Value.Raw, 10, 64)
	if err != nil || n < 0 || (a.Value.Kind != ast.IntValue && a.Value.Kind != ast.StringValue) {
		return 0, false, fmt.Errorf("@cost weight must be a non-negative integer, got %q", a.Value.Raw)
	}
	return n, true, nil
}

// listSizeOf reads @listSize(assumedSize: Int, slicingArguments: [String!]).
func listSizeOf(dirs ast.DirectiveList) (*listSize, error) {
	d := dirs.ForName("listSize")
	if d == nil {
		return nil, nil
	}
	ls := &listSize{assumed: -1}
	if a := d.Arguments.ForName("assumedSize"); a != nil && a.Value != nil && a.Value.Kind != ast.NullValue {
		n, err := strconv.ParseInt(a.Value.Raw, 10, 64)
		if err != nil || n < 0 || a.Value.Kind != ast.IntValue {
			return nil, fmt.Errorf("@listSize assumedSize must be a non-negative integer, got %q", a.Value.Raw)
		}
		ls.assumed = n
	}
	if a := d.Arguments.ForName("slicingArguments"); a != nil && a.Value != nil {
		switch a.Value.Kind {
		case ast.ListValue:
			for _, c := range a.Value.Children {
				if c.Value == nil || c.Value.Kind != ast.StringValue {
					return nil, fmt.Errorf("@listSize slicingArguments must be a list of strings")
				}
				ls.slicing = append(ls.slicing, c.Value.Raw)
			}
		case ast.StringValue: // a single value coerces to a list
			ls.slicing = []string{a.Value.Raw}
		case ast.NullValue:
		default:
			return nil, fmt.Errorf("@listSize slicingArguments must be a list of strings")
		}
	}
	return ls, nil
}
