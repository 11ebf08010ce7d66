--[=[
  include reverse_delta: the previous state of a record as what must be undone, for a topic
  that keeps history (issue 25.1: memory per retained version). A change event of such a
  topic carries the new record whole (data) and, as its previous state, only the top-level
  members that differ:

    ~[{<member before>, …}, [<member name absent before>, …]]

  Each member before is copied as the text it had in the stored record (exact: no number is
  re-encoded), each name as its JSON string literal. sow_redis.model.events rebuilds the
  previous record from data: the names absent before removed, the members before put back.
  Members compare by text: a member written differently (1.0 against 1) counts as changed,
  which costs bytes, never exactness.

  reverse_delta(previous, data) returns that text, or previous itself when it is "null" (no
  record before) or either text is not a JSON object this scanner reads (then the event
  carries the previous record whole, as without history).
]=]

-- the string functions as locals: a global lookup costs more in Redis's Lua than the call
local str_find, str_byte, str_sub = string.find, string.byte, string.sub

-- the index of the quote that ends the JSON string starting at i (a quote), or nil: a plain
-- search for the next quote, taken when an even number of backslashes precedes it
local function string_end(text, i)
  local j = i + 1
  while true do
    local k = str_find(text, '"', j, true)
    if not k then return nil end
    local b = k - 1
    while b > i and str_byte(text, b) == 92 do b = b - 1 end  -- \
    if (k - 1 - b) % 2 == 0 then return k end
    j = k + 1
  end
end

-- bytes that end a scalar (a number, true, false or null): , } ] and JSON whitespace
local SCALAR_END = {[44] = true, [125] = true, [93] = true, [32] = true, [9] = true,
  [10] = true, [13] = true}

-- the index of the last character of the JSON value starting at i, or nil
local function value_end(text, i)
  local c = str_byte(text, i)
  if c == 34 then return string_end(text, i) end
  if c ~= 123 and c ~= 91 then  -- not { or [: a number, true, false or null
    local k = i + 1
    while true do
      local b = str_byte(text, k)
      if not b then return nil end
      if SCALAR_END[b] then return k - 1 end
      k = k + 1
    end
  end
  local depth, j = 0, i
  while true do
    local k = str_find(text, '[%[%]{}"]', j)
    if not k then return nil end
    local b = str_byte(text, k)
    if b == 34 then
      k = string_end(text, k)
      if not k then return nil end
    elseif b == 123 or b == 91 then
      depth = depth + 1
    else
      depth = depth - 1
      if depth == 0 then return k end
    end
    j = k + 1
  end
end

-- the first character at or after i that is not whitespace (nil: none); compact JSON, the
-- common case, needs no pattern
local function skip_space(text, i)
  local b = str_byte(text, i)
  if b and b ~= 32 and b ~= 9 and b ~= 10 and b ~= 13 and b ~= 11 and b ~= 12 then
    return i
  end
  return str_find(text, "[^%s]", i)
end

-- the top-level members of a JSON object text: {name literal = value text} and the names in
-- order, or nil when the text is not an object this scanner reads. A member is matched with
-- few calls (each library call costs Lua about 0.1 µs): the name and colon by one pattern
-- (a name with an escape by string_end), a scalar's end by one pattern.
local function members(text)
  local i = skip_space(text, 1)
  if not i or str_byte(text, i) ~= 123 then return nil end
  local map, names = {}, {}
  i = skip_space(text, i + 1)
  if i and str_byte(text, i) == 125 then return map, names end  -- {}
  while i do
    local _, e, name = str_find(text, '^("[^"\\]*")%s*:%s*', i)
    if not e then  -- not a string, or a name with an escape
      if str_byte(text, i) ~= 34 then return nil end
      local ke = string_end(text, i)
      if not ke then return nil end
      name = str_sub(text, i, ke)
      _, e = str_find(text, "^%s*:%s*", ke + 1)
      if not e then return nil end
    end
    local vs = e + 1
    local c, ve = str_byte(text, vs), nil
    if c == 34 or c == 123 or c == 91 then
      ve = value_end(text, vs)
    elseif c then
      _, ve = str_find(text, "^[^,}%]%s]+", vs)
    end
    if not ve then return nil end
    if map[name] == nil then names[#names + 1] = name end
    map[name] = str_sub(text, vs, ve)
    local sep
    _, sep = str_find(text, "^%s*[,}]", ve + 1)
    if not sep then return nil end
    if str_byte(text, sep) == 125 then return map, names end  -- }
    i = skip_space(text, sep + 1)
  end
  return nil
end

local function reverse_delta(previous, data)
  if previous == "null" then return previous end
  local before, before_names = members(previous)
  if not before then return previous end
  local after, after_names = members(data)
  if not after then return previous end
  local changed, absent = {}, {}
  for _, name in ipairs(before_names) do
    local v = before[name]
    if after[name] ~= v then changed[#changed + 1] = name .. ":" .. v end
  end
  for _, name in ipairs(after_names) do
    if before[name] == nil then absent[#absent + 1] = name end
  end
  return "~[{" .. table.concat(changed, ",") .. "},[" .. table.concat(absent, ",") .. "]]"
end
