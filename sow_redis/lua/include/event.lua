--[[
  include event: the one definition of a change event (documented in sow_redis/events.py).

  change_event(topic, op, key, seq, id, expiry_ms, data, reason) returns the JSON text
    {"topic":…,"op":…,"sow_key":…,"seq":N,"id":"<stream id>"[,"reason":…],"expiry_ms":N,"data":{…}}
  Strings go through cjson.encode (quotes, newlines and control characters escaped); seq and
  expiry_ms are decimal integer text; data is the stored record, already JSON object text.
]]
local function change_event(topic, op, key, seq, id, expiry_ms, data, reason)
  local out = {'{"topic":', cjson.encode(topic), ',"op":', cjson.encode(op),
    ',"sow_key":', cjson.encode(key), ',"seq":', string.format("%d", seq),
    ',"id":', cjson.encode(id)}
  if reason then
    out[#out + 1] = ',"reason":'
    out[#out + 1] = cjson.encode(reason)
  end
  out[#out + 1] = ',"expiry_ms":'
  out[#out + 1] = expiry_ms
  out[#out + 1] = ',"data":'
  out[#out + 1] = data
  out[#out + 1] = '}'
  return table.concat(out)
end
