// Opens the server's WebSockets for both pages. A page opened with ?api_key=KEY passes the key as a
// subprotocol (browsers cannot set an Authorization header on a WebSocket); the server echoes "realtime".
function openServerSocket(path) {
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
  const key = new URLSearchParams(location.search).get("api_key");
  return key ? new WebSocket(url, ["realtime", `openai-insecure-api-key.${key}`]) : new WebSocket(url);
}
