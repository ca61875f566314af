// An OAuth-first MCP client, as mcp-remote and the MCP Inspector are: the
// official TypeScript SDK's Streamable HTTP transport with an OAuth provider
// that would register dynamically and open a browser. Used by internal/e2e.
//
//   node oauth-client.mjs URL [--no-provider]
//
// Connects to URL without credentials and prints one JSON object on stdout:
//   {"connected", "error", "requests": ["METHOD /path"], "redirected"}
// "redirected" is whether the SDK got as far as sending the user to an
// authorization page. Exits non-zero only on a usage error.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, flag] = process.argv.slice(2);
if (!url) {
  console.error("usage: node oauth-client.mjs URL [--no-provider]");
  process.exit(2);
}

const requests = [];
const recordingFetch = async (input, init) => {
  const u = new URL(input instanceof Request ? input.url : input);
  requests.push(`${init?.method ?? "GET"} ${u.pathname}`);
  return fetch(input, init);
};

let redirected = false;
let clientInformation;
let tokens;
let verifier = "";
const provider = {
  get redirectUrl() { return "http://127.0.0.1:1/oauth/callback"; },
  get clientMetadata() {
    return { client_name: "oauth-first test client", redirect_uris: ["http://127.0.0.1:1/oauth/callback"] };
  },
  clientInformation: () => clientInformation,
  saveClientInformation: (info) => { clientInformation = info; },
  tokens: () => tokens,
  saveTokens: (t) => { tokens = t; },
  redirectToAuthorization: () => { redirected = true; },
  saveCodeVerifier: (v) => { verifier = v; },
  codeVerifier: () => verifier,
};

const client = new Client({ name: "mcpgate-oauth-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(url), {
  authProvider: flag === "--no-provider" ? undefined : provider,
  fetch: recordingFetch,
});
let connected = false;
let error = "";
try {
  await client.connect(transport);
  connected = true;
  await client.close();
} catch (err) {
  error = String(err?.message ?? err);
}
console.log(JSON.stringify({ connected, error, requests, redirected }));
