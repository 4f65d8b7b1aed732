// Drives the official Stripe SDK against a base URL, as a user's code
// would: it creates customers, retrying on its own (a timeout, a 409) with
// the Idempotency-Key it sends with every POST. It prints each call's
// outcome and every attempt (when, with which key) as one JSON line:
// replay_test.go reads it.
//
//   node stripe.mjs '{"base":"http://127.0.0.1:8080","calls":2,"timeout":500,"retries":8}'
import Stripe from "stripe";

const o = JSON.parse(process.argv[2]);
const start = Date.now();
const attempts = [];
const countingFetch = (url, init) => {
  attempts.push({ at: Date.now() - start, key: new Headers(init.headers).get("idempotency-key") });
  return fetch(url, init);
};
const base = new URL(o.base);
const stripe = new Stripe("sk_test_cascade", {
  host: base.hostname,
  port: base.port,
  protocol: "http",
  timeout: o.timeout ?? 500,
  maxNetworkRetries: o.retries ?? 8,
  httpClient: Stripe.createFetchHttpClient(countingFetch),
});
const results = [];
for (let i = 0; i < (o.calls ?? 1); i++) {
  try {
    const c = await stripe.customers.create({ email: `customer${i}@example.com` });
    results.push({ ok: true, id: c.id, email: c.email });
  } catch (err) {
    results.push({ ok: false, class: err.constructor.name, status: err.statusCode ?? null, message: err.message });
  }
}
console.log(JSON.stringify({ results, attempts }));
