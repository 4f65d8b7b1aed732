// The status page of Cascade's admin API: it reads the API's JSON routes
// every few seconds and shows them. Everything it shows is put in text
// nodes (the values of the API are any bytes a client sent): no HTML is
// ever parsed from data.

// routes are the admin API's JSON routes the page reads, relative to the
// page (/rate_limit/ui), so that they resolve under whatever prefix it is
// served at.
const routes = {
	trees: "trees",
	top: "top?n=20",
	overrides: "overrides",
	entitlements: "entitlements",
	status: "status",
};

const refreshMs = 3000;

// el makes an element of tag with the given class (or none) and children:
// nodes, or strings and numbers put in text nodes.
function el(tag, cls, ...children) {
	const e = document.createElement(tag);
	if (cls) {
		e.className = cls;
	}
	for (const c of children) {
		if (c === null || c === undefined || c === false) {
			continue;
		}
		e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
	}
	return e;
}

// table makes a table of the given header cells and rows (arrays of cells:
// nodes or text); a cell that is a number is aligned right.
function table(head, rows) {
	const thead = el("thead", null, el("tr", null, ...head.map((h) => el("th", null, h))));
	const tbody = el("tbody", null);
	for (const row of rows) {
		tbody.appendChild(el("tr", null, ...row.map((c) => el("td", typeof c === "number" ? "num" : null, c))));
	}
	return el("table", null, thead, tbody);
}

function empty(text) {
	return el("p", "muted", text);
}

// known are the states the stylesheet colours.
const known = new Set(["enforce", "warn", "shadow", "healthy", "critical", "floor", "open", "closed"]);

function state(text) {
	return el("span", known.has(text) ? text : null, text);
}

function value(v) {
	return el("span", "value", v);
}

function tag(text) {
	return el("span", "tag", text);
}

// limitText writes a limit as a Caddyfile does ("100 tokens/h burst 5"):
// the trees' limits carry their text, the overrides' and entitlements'
// are written here as hierarchy.Limit.String writes them.
function limitText(l) {
	if (l.text) {
		return l.text;
	}
	if (l.algorithm === "concurrent") {
		return `${l.count} concurrent`;
	}
	let s = l.amount || String(l.count);
	if (l.dimension && l.dimension !== "requests") {
		s += ` ${l.dimension}`;
	}
	s += `/${l.per}`;
	if (l.burst > 0) {
		s += ` burst ${l.burst}`;
	}
	if (l.algorithm && l.algorithm !== "gcra") {
		s += l.algorithm === "sliding_approx" ? " sliding approx" : ` ${l.algorithm}`;
	}
	return s;
}

function limitsText(limits, unlimited) {
	if (unlimited) {
		return "unlimited";
	}
	return (limits || []).map(limitText).join(", ");
}

function time(t) {
	if (!t) {
		return "";
	}
	const d = new Date(t);
	return isNaN(d) ? String(t) : d.toLocaleString();
}

function fixed(n, digits) {
	return typeof n === "number" ? n.toFixed(digits) : "";
}

function renderTrees(trees) {
	if (trees.length === 0) {
		return [empty("No rate_limit handler is loaded.")];
	}
	return trees.map((t) => {
		const mode = el("p", null, "mode ", state(t.mode));
		if (t.mode_override) {
			mode.appendChild(document.createTextNode(` (set at runtime, configured ${t.configured_mode}`
				+ (t.mode_override.note ? `: ${t.mode_override.note}` : "") + ")"));
		}
		mode.appendChild(document.createTextNode(" · store "));
		mode.appendChild(value(t.store));
		if (t.plan) {
			mode.appendChild(document.createTextNode(` · plan from ${t.plan}, default ${t.default_plan || "none"}`));
		}
		const rows = t.tiers.map((tier) => {
			const flags = el("span", null, tier.adaptive && tag("adaptive"), tier.sensitive && tag("sensitive"),
				tier.missing && tag(`missing: ${tier.missing}`));
			const values = el("ul", null);
			for (const v of tier.values || []) {
				values.appendChild(el("li", null, value(v.value), ` ${limitsText(v.limits, v.unlimited)} (${v.source}`
					+ (v.expires ? `, until ${time(v.expires)}` : "") + (v.note ? `: ${v.note}` : "") + ")"));
			}
			for (const [name, p] of Object.entries(tier.plans || {})) {
				values.appendChild(el("li", null, `plan ${name}: ${limitsText(p.limits, p.unlimited)}`));
			}
			return [tier.name, value(tier.key), limitsText(tier.limits), flags, values];
		});
		const card = el("div", "tree", el("h3", null, t.name), mode,
			table(["tier", "key", "limits", "", "values and plans"], rows));
		for (const p of t.allocation_problems || []) {
			card.appendChild(el("p", "error", p));
		}
		return card;
	});
}

function pathText(path) {
	return path.map((p) => `${p.tier}=${p.value}`).join(" / ");
}

function renderTop(top) {
	if (top.keys.length === 0) {
		return [empty("No request has been denied.")];
	}
	return [
		el("p", "muted", `${top.total} denials counted. A key's count may be over by up to its error.`),
		table(["denials", "error", "tree", "denied by", "path"],
			top.keys.map((k) => [k.count, k.error, k.tree, k.tier, value(pathText(k.path))])),
	];
}

function renderOverrides(o) {
	const out = [];
	if (o.overrides.length === 0) {
		out.push(empty("No runtime override."));
	} else {
		out.push(table(["tree", "tier", "value", "limits", "expires", "note", "updated"],
			o.overrides.map((x) => [x.tree, x.tier, value(x.value), limitsText(x.limits, x.unlimited),
				time(x.expires), x.note || "", time(x.updated)])));
	}
	if (o.modes.length === 0) {
		out.push(empty("No runtime mode."));
	} else {
		out.push(table(["tree", "mode", "note", "updated"],
			o.modes.map((m) => [m.tree, state(m.mode), m.note || "", time(m.updated)])));
	}
	return out;
}

function renderEntitlements(list) {
	if (list.length === 0) {
		return [empty("No runtime entitlement.")];
	}
	return [table(["block", "value", "plan", "limits", "expires", "note", "updated"],
		list.map((x) => [x.name, value(x.value), x.plan || "", limitsText(x.limits), time(x.expires), x.note || "",
			time(x.updated)]))];
}

function renderStores(stores) {
	if (stores.length === 0) {
		return [empty("No store is in use.")];
	}
	return [table(["store", "kind", "trees", "circuit breakers", "instances", "leases", "buckets"],
		stores.map((s) => {
			const breakers = el("ul", null);
			for (const b of s.breakers || []) {
				breakers.appendChild(el("li", null, value(b.node), " ", state(b.open ? "open" : "closed"),
					` (opened ${b.trips} times)`));
			}
			const lease = s.lease
				? `${s.lease.local} local, ${s.lease.grants} grants (${s.lease.leased} leased), ${s.lease.strict} strict, `
					+ `${s.lease.released} released, ${s.lease.renewals} renewed, ${s.lease.peer_resets} peer resets`
				: "";
			const buckets = s.keys === undefined ? "" : `${s.keys} (${s.evictions} evicted)`;
			return [value(s.name), s.kind, s.trees.join(", "), s.breakers ? breakers : "", s.instances ?? "", lease,
				buckets];
		}))];
}

function renderAdaptive(list) {
	if (list.length === 0) {
		return [empty("No tier is adaptive.")];
	}
	return list.flatMap((a) => {
		const head = el("p", null, "level ", state(a.level), ` · factor ${fixed(a.factor, 3)} (local ${fixed(a.local_factor, 3)}`
			+ (a.shared_factor === undefined ? "" : `, shared ${fixed(a.shared_factor, 3)}`)
			+ `, floor ${fixed(a.floor, 2)}) · ${a.requests} requests in the window · sampled ${time(a.at)}`);
		return [
			head,
			table(["tree", "priority", "factor"], a.trees.map((t) => [t.tree, t.priority, fixed(t.factor, 3)])),
			table(["signal", "value", "pressure", "counts", "error"], a.signals.map((s) => [
				s.name, s.measured ? `${fixed(s.value, 3)}${s.unit ? " " + s.unit : ""}` : "not measured",
				s.measured ? fixed(s.pressure, 2) : "", s.counts ? "yes" : "no", s.error || ""])),
		];
	});
}

const sections = [
	["trees", "trees", renderTrees],
	["top", "top", renderTop],
	["overrides", "overrides", renderOverrides],
	["entitlements", "entitlements", renderEntitlements],
	["stores", "status", (s) => renderStores(s.stores)],
	["adaptive", "status", (s) => renderAdaptive(s.adaptive)],
];

// load reads one route; an error says which and why (the API's message).
async function load(route) {
	const res = await fetch(route, { headers: { Accept: "application/json" }, cache: "no-store" });
	const body = await res.text();
	if (!res.ok) {
		let msg = body;
		try {
			msg = JSON.parse(body).error || body;
		} catch {
			// not JSON: the text as it is
		}
		throw new Error(`${route}: ${res.status} ${msg}`);
	}
	return JSON.parse(body);
}

async function refresh() {
	const names = Object.keys(routes);
	const results = await Promise.allSettled(names.map((n) => load(routes[n])));
	const data = {};
	const errors = [];
	results.forEach((r, i) => {
		if (r.status === "fulfilled") {
			data[names[i]] = r.value;
		} else {
			errors.push(el("p", null, String(r.reason && r.reason.message ? r.reason.message : r.reason)));
		}
	});
	for (const [id, name, render] of sections) {
		if (data[name] !== undefined) {
			document.getElementById(id).replaceChildren(...render(data[name]));
		}
	}
	document.getElementById("errors").replaceChildren(...errors);
	document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}, every ${refreshMs / 1000} s`;
}

async function tick() {
	try {
		await refresh();
	} catch (err) {
		document.getElementById("errors").replaceChildren(el("p", null, `showing the API's answers: ${err}`));
	} finally {
		setTimeout(tick, refreshMs);
	}
}

tick();
