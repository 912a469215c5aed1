// Opens the server's WebSockets for both pages. A page opened with ?api_key=KEY passes the key as a
// subprotocol (browsers cannot set an Authorization header on a WebSocket); the server echoes "realtime".
// The key is taken out of the address bar at once (kept for this tab in sessionStorage), so it stays out
// of the history and of bookmarks; the pages send no referrer (their <meta name="referrer">).
const API_KEY_ITEM = "rtv_api_key";

(function keepKeyOutOfTheUrl() {
  const params = new URLSearchParams(location.search);
  const key = params.get("api_key");
  if (key === null) return;
  sessionStorage.setItem(API_KEY_ITEM, key);
  params.delete("api_key");
  const rest = params.toString();
  history.replaceState(history.state, "", `${location.pathname}${rest ? `?${rest}` : ""}${location.hash}`);
})();

function openServerSocket(path) {
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
  const key = sessionStorage.getItem(API_KEY_ITEM);
  return key ? new WebSocket(url, ["realtime", `openai-insecure-api-key.${key}`]) : new WebSocket(url);
}
