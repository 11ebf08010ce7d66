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

-- the index of the quote that ends the JSON string starting at i (a quote), or nil
local function string_end(text, i)
  local j = i + 1
  while true do
    local k = string.find(text, '["\\]', j)
    if not k then return nil end
    if string.byte(text, k) == 34 then return k end  -- "
    j = k + 2  -- an escape: skip the escaped character
  end
end

-- the index of the last character of the JSON value starting at i, or nil
local function value_end(text, i)
  local c = string.byte(text, i)
  if c == 34 then return string_end(text, i) end
  if c ~= 123 and c ~= 91 then  -- not { or [: a number, true, false or null
    local k = string.find(text, "[,}%]%s]", i)
    if not k then return nil end
    return k - 1
  end
  local depth, j = 0, i
  while true do
    local k = string.find(text, '[%[%]{}"]', j)
    if not k then return nil end
    local b = string.byte(text, k)
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

-- the top-level members of a JSON object text: {name literal = value text} and the names in
-- order, or nil when the text is not an object this scanner reads
local function members(text)
  local i = string.find(text, "[^%s]")
  if not i or string.byte(text, i) ~= 123 then return nil end
  local map, names = {}, {}
  i = string.find(text, "[^%s]", i + 1)
  if i and string.byte(text, i) == 125 then return map, names end  -- {}
  while i do
    if string.byte(text, i) ~= 34 then return nil end
    local ke = string_end(text, i)
    if not ke then return nil end
    local name = string.sub(text, i, ke)
    local colon = string.find(text, "[^%s]", ke + 1)
    if not colon or string.byte(text, colon) ~= 58 then return nil end
    local vs = string.find(text, "[^%s]", colon + 1)
    if not vs then return nil end
    local ve = value_end(text, vs)
    if not ve then return nil end
    if map[name] == nil then names[#names + 1] = name end
    map[name] = string.sub(text, vs, ve)
    local sep = string.find(text, "[^%s]", ve + 1)
    if not sep then return nil end
    local b = string.byte(text, sep)
    if b == 125 then return map, names end  -- }
    if b ~= 44 then return nil end  -- ,
    i = string.find(text, "[^%s]", sep + 1)
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
