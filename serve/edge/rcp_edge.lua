-- The route table task and two small helpers of the rcp edge (HAProxy, `serve.edge`).
--
-- Owns: fetching the ingress's route table (GET <prefix>v1/models?format=edge) through a
-- healthy Serve proxy once a second and loading it into the weights map the frontend
-- routes predicts by; emptying that map when the table is older than the table's max age
-- (predicts then go to the ingress, which routes them itself); the edge's own gauges
-- (`rcp_edge_route_table_*`) for Prometheus; removing request headers that a client's
-- Connection header names (RFC 9112 7.6.1).
-- Must not: decide a pool (the frontend's rules do, by the map), touch a request otherwise.

local MAP = os.getenv("RCP_EDGE_MAP")
local TABLE_PATH = os.getenv("RCP_EDGE_TABLE_PATH")
local BACKEND = os.getenv("RCP_EDGE_BACKEND") or "routed"
local INTERVAL_MS = 1000  -- a fetch costs an ingress replica ~5 ms of CPU
local MAX_TABLE_BYTES = 65536

local state = {
  generation = -1,     -- of the table in the map; -1: none
  fetched_s = nil,     -- core.now() seconds of the last good fetch
  max_age_s = 5,       -- the table's own max age (its `max_age_s` line)
  models = {},         -- model -> threshold now in the map
}

local function now_s()
  local t = core.now()
  return t.sec + t.usec / 1e6
end

-- One GET over a fresh connection; the body, or nil. HTTP/1.0 so the proxy closes.
local function fetch(addr)
  local host, port = string.match(addr, "^(.+):(%d+)$")
  if not host then return nil end
  local sock = core.tcp()
  sock:settimeout(1)
  if not sock:connect(host, tonumber(port)) then
    sock:close()
    return nil
  end
  local ok = sock:send("GET " .. TABLE_PATH .. " HTTP/1.0\r\nHost: rcp-edge\r\n"
    .. "User-Agent: rcp-edge\r\n\r\n")
  if not ok then
    sock:close()
    return nil
  end
  local response = sock:receive("*a")
  sock:close()
  if not response or #response > MAX_TABLE_BYTES then return nil end
  if not string.match(response, "^HTTP/1%.[01] 200 ") then return nil end
  return string.match(response, "\r\n\r\n(.*)$")
end

-- The text table: "rcp-edge-table 1", "generation N", "max_age_s S", "model <name> <0-1000>".
local function parse(body)
  if not body or string.sub(body, 1, 17) ~= "rcp-edge-table 1\n" then return nil end
  local t = {models = {}}
  t.generation = tonumber(string.match(body, "\ngeneration (%d+)\n"))
  t.max_age_s = tonumber(string.match(body, "\nmax_age_s ([%d%.]+)\n"))
  if not t.generation or not t.max_age_s then return nil end
  for name, thr in string.gmatch(body, "\nmodel ([%w_]+) (%d+)") do
    local v = tonumber(thr)
    if v and v >= 0 and v <= 1000 then t.models[name] = v end
  end
  return t
end

local function apply(t)
  for name, _ in pairs(state.models) do
    if t.models[name] == nil then core.del_map(MAP, name) end
  end
  for name, thr in pairs(t.models) do
    if state.models[name] ~= thr then core.set_map(MAP, name, tostring(thr)) end
  end
  if t.generation ~= state.generation then
    core.Info("rcp-edge: route table generation " .. t.generation)
  end
  state.models = t.models
  state.generation = t.generation
  state.max_age_s = t.max_age_s
  state.fetched_s = now_s()
end

local function clear(reason)
  for name, _ in pairs(state.models) do core.del_map(MAP, name) end
  if state.generation ~= -1 then
    core.Warning("rcp-edge: " .. reason .. "; predicts go through the ingress")
  end
  state.models = {}
  state.generation = -1
end

-- The servers to ask: the UP node proxies, then the head's (a backup server: a request the
-- head's proxy holds when the head dies can freeze the replica it was sent to).
local function candidates()
  local nodes, head = {}, {}
  local be = core.backends[BACKEND]
  if not be then return nodes end
  for _, srv in pairs(be.servers) do
    local st = srv:get_stats()
    if st and st.status == "UP" then
      if tostring(st.bck) == "1" then
        table.insert(head, srv:get_addr())
      else
        table.insert(nodes, srv:get_addr())
      end
    end
  end
  for _, addr in ipairs(head) do table.insert(nodes, addr) end
  return nodes
end

core.register_task(function()
  while true do
    local got = false
    for _, addr in ipairs(candidates()) do
      local t = parse(fetch(addr))
      if t then
        apply(t)
        got = true
        break
      end
    end
    if not got and state.fetched_s and state.generation ~= -1
        and now_s() - state.fetched_s > state.max_age_s then
      clear("no route table for " .. state.max_age_s .. " s")
    end
    core.msleep(INTERVAL_MS)
  end
end)

-- GET /rcp/metrics on the admin listener: the table's generation and age, Prometheus text.
core.register_service("rcp_edge_metrics", "http", function(applet)
  local age = -1
  if state.fetched_s and state.generation ~= -1 then age = now_s() - state.fetched_s end
  local body = "# HELP rcp_edge_route_table_generation The generation of the route table "
    .. "the edge routes predicts by (-1: none; predicts go through the ingress).\n"
    .. "# TYPE rcp_edge_route_table_generation gauge\n"
    .. "rcp_edge_route_table_generation " .. state.generation .. "\n"
    .. "# HELP rcp_edge_route_table_age_seconds Seconds since that table was fetched (-1: none).\n"
    .. "# TYPE rcp_edge_route_table_age_seconds gauge\n"
    .. string.format("rcp_edge_route_table_age_seconds %.3f\n", age)
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
  applet:add_header("content-length", string.len(body))
  applet:start_response()
  applet:send(body)
end)

-- Remove the headers a request's Connection header names (hop-by-hop, RFC 9112 7.6.1).
core.register_action("rcp_strip_connection_headers", {"http-req"}, function(txn)
  local headers = txn.http:req_get_headers()
  local conn = headers["connection"]
  if not conn then return end
  for _, value in pairs(conn) do
    for token in string.gmatch(value, "[^,%s]+") do
      local name = string.lower(token)
      if name ~= "close" and name ~= "keep-alive" and name ~= "host" then
        txn.http:req_del_header(name)
      end
    end
  end
end, 0)
