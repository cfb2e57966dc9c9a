// OpenAI chat messages and tools, validated and put in the shape chat templates expect:
// content as a string (text parts joined), "developer" as "system", assistant tool-call
// arguments as JSON objects (Qwen3.5's template iterates them; clients send them as strings).
#pragma once
#include "server/json_fields.h"

namespace petrel::server {

// `body`'s "messages": a non-empty array of messages, each checked by role.
json parse_messages(const Fields& body);
// `body`'s "tools": null when absent or empty, else the array of function tools as given.
json parse_tools(const Fields& body);
// `body`'s "chat_template_kwargs": an object (empty when absent) whose keys name no variable the
// render sets itself (ChatTemplate::sets_variable).
json parse_template_kwargs(const Fields& body);

}  // namespace petrel::server
