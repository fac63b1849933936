// The workbench's HTTP client: every call carries `Authorization: Bearer TOKEN` once a token is set
// (kept in this module's memory only: no cookie, no storage), and every error response becomes an
// ApiError with the server's status, code, field and message.

let token = null;

export function setToken(value) {
  token = value || null;
}

export function hasToken() {
  return token !== null;
}

export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  if (token) h.Authorization = `Bearer ${token}`;
  return h;
}

async function failure(response) {
  let code = "unknown";
  let message = `${response.status} ${response.statusText}`;
  let field;
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
      field = body.error.field;
    }
  } catch {
    // Not JSON (a proxy's page, say): keep the status line.
  }
  return new ApiError(response.status, code, message, field);
}

/** A JSON request; resolves to the parsed body (null for 204). */
export async function api(path, { method = "GET", body } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }), cache: "no-store" };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  if (response.status === 204) return null;
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

/** Fetches `path` with the token and saves the body under `filename` through a Blob URL. */
export async function download(path, filename) {
  const response = await fetch(path, { headers: headers({ Accept: "*/*" }), cache: "no-store" });
  if (!response.ok) throw await failure(response);
  const blob = await response.blob();
  saveBlob(blob, filename);
  return blob;
}

/** Saves `blob` as `filename` (an anchor with `download` on a Blob URL, revoked afterwards). */
export function saveBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  a.hidden = true;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
