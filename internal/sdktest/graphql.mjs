// Drives graphql-request, a GraphQL client that reads a response's
// extensions, against a base URL, and prints what it saw of each query
// as one JSON line: graphql_cost_test.go reads it.
//
//   node graphql.mjs '{"url":"http://127.0.0.1:8080/graphql","queries":[{"client":"c1","query":"{ viewer { id } }"}]}'
import { GraphQLClient, ClientError } from "graphql-request";

const o = JSON.parse(process.argv[2]);
const results = [];
for (const q of o.queries) {
  const client = new GraphQLClient(o.url, { headers: { "X-Client": q.client } });
  try {
    const res = await client.rawRequest(q.query, q.variables ?? {});
    results.push({ ok: true, status: res.status, extensions: res.extensions ?? null, charged: res.headers.get("cascade-cost") });
  } catch (err) {
    if (!(err instanceof ClientError)) throw err;
    // graphql-request parses a JSON error body's extensions itself; a
    // problem+json body is read as its users read it.
    let body = null;
    try { body = JSON.parse(err.response.body); } catch {}
    results.push({ ok: false, status: err.response.status, extensions: err.response.extensions ?? body?.extensions ?? null });
  }
}
console.log(JSON.stringify({ results }));
