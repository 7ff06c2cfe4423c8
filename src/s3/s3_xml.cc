// S3's XML documents through pugixml.
#include "s3/s3_xml.h"

#include <pugixml.hpp>

#include <sstream>

#include "s3/s3_encoding.h"

namespace shardsafe {
namespace {

Status Malformed(std::string_view what, std::string_view why) {
  return DataLossError("malformed " + std::string(what) + " response: " + std::string(why));
}

// Parses `body` and returns its root element, which must be named `root`.
Result<pugi::xml_node> Root(pugi::xml_document& doc, std::string_view body, const char* root) {
  pugi::xml_parse_result parsed = doc.load_buffer(body.data(), body.size());
  if (!parsed) return Malformed(root, parsed.description());
  pugi::xml_node node = doc.child(root);
  if (!node) return Malformed(root, "no <" + std::string(root) + "> element");
  return node;
}

std::string Text(pugi::xml_node parent, const char* name) {
  return parent.child(name).text().as_string();
}

bool IsTrue(pugi::xml_node parent, const char* name) {
  return Text(parent, name) == "true";
}

// A key or prefix, decoded when the response says EncodingType url.
std::string KeyText(pugi::xml_node parent, const char* name, bool url_encoded) {
  std::string text = Text(parent, name);
  return url_encoded ? UriDecode(text) : text;
}

bool IsUrlEncoded(pugi::xml_node root) { return Text(root, "EncodingType") == "url"; }

ObjectInfo ParseContents(pugi::xml_node c, bool url_encoded) {
  ObjectInfo info;
  info.key = KeyText(c, "Key", url_encoded);
  info.size = c.child("Size").text().as_ullong();
  info.etag = Text(c, "ETag");
  info.mtime_seconds = ParseIso8601(Text(c, "LastModified"));
  return info;
}

std::string Serialize(const pugi::xml_document& doc) {
  std::ostringstream out;
  doc.save(out, "", pugi::format_raw);
  return out.str();
}

pugi::xml_node AddS3Root(pugi::xml_document& doc, const char* name) {
  pugi::xml_node root = doc.append_child(name);
  root.append_attribute("xmlns") = "http://s3.amazonaws.com/doc/2006-03-01/";
  return root;
}

}  // namespace

S3ErrorBody ParseErrorBody(std::string_view body) {
  pugi::xml_document doc;
  if (!doc.load_buffer(body.data(), body.size())) return {};
  pugi::xml_node error = doc.child("Error");
  return {Text(error, "Code"), Text(error, "Message")};
}

Result<ObjectsPage> ParseListObjectsV2(std::string_view body) {
  pugi::xml_document doc;
  SS_ASSIGN_OR_RETURN(pugi::xml_node root, Root(doc, body, "ListBucketResult"));
  bool url_encoded = IsUrlEncoded(root);
  ObjectsPage page;
  for (pugi::xml_node c : root.children("Contents")) {
    page.objects.push_back(ParseContents(c, url_encoded));
  }
  for (pugi::xml_node p : root.children("CommonPrefixes")) {
    page.common_prefixes.push_back(KeyText(p, "Prefix", url_encoded));
  }
  page.truncated = IsTrue(root, "IsTruncated");
  page.next_continuation_token = Text(root, "NextContinuationToken");
  if (page.truncated && page.next_continuation_token.empty()) {
    return Malformed("ListObjectsV2", "truncated page without a NextContinuationToken");
  }
  return page;
}

Result<UploadsPage> ParseListMultipartUploads(std::string_view body) {
  pugi::xml_document doc;
  SS_ASSIGN_OR_RETURN(pugi::xml_node root, Root(doc, body, "ListMultipartUploadsResult"));
  bool url_encoded = IsUrlEncoded(root);
  UploadsPage page;
  for (pugi::xml_node u : root.children("Upload")) {
    page.uploads.push_back({KeyText(u, "Key", url_encoded), Text(u, "UploadId"),
                            ParseIso8601(Text(u, "Initiated"))});
  }
  page.truncated = IsTrue(root, "IsTruncated");
  page.next_key_marker = KeyText(root, "NextKeyMarker", url_encoded);
  page.next_upload_id_marker = Text(root, "NextUploadIdMarker");
  if (page.truncated && page.next_key_marker.empty()) {
    return Malformed("ListMultipartUploads", "truncated page without a NextKeyMarker");
  }
  return page;
}

Result<std::string> ParseUploadId(std::string_view body) {
  pugi::xml_document doc;
  SS_ASSIGN_OR_RETURN(pugi::xml_node root, Root(doc, body, "InitiateMultipartUploadResult"));
  std::string id = Text(root, "UploadId");
  if (id.empty()) return Malformed("CreateMultipartUpload", "no UploadId");
  return id;
}

Result<std::string> ParseCompletedETag(std::string_view body) {
  pugi::xml_document doc;
  pugi::xml_parse_result parsed = doc.load_buffer(body.data(), body.size());
  if (!parsed) return Malformed("CompleteMultipartUpload", parsed.description());
  // S3 names the root CompleteMultipartUploadResult, moto ...Response: like
  // botocore, read the ETag whatever the root's name.
  std::string etag = Text(doc.document_element(), "ETag");
  if (etag.empty()) return Malformed("CompleteMultipartUpload", "no ETag");
  return etag;
}

std::string CompleteMultipartUploadBody(std::span<const CompletedPart> parts) {
  pugi::xml_document doc;
  pugi::xml_node root = AddS3Root(doc, "CompleteMultipartUpload");
  for (const CompletedPart& p : parts) {
    pugi::xml_node part = root.append_child("Part");
    part.append_child("PartNumber").text() = p.number;
    part.append_child("ETag").text() = p.etag.c_str();
    if (p.crc32c) {
      part.append_child("ChecksumCRC32C").text() = Crc32cHeaderValue(*p.crc32c).c_str();
    }
  }
  return Serialize(doc);
}

std::string CreateBucketBody(const std::string& region) {
  if (region == "us-east-1") return "";
  pugi::xml_document doc;
  AddS3Root(doc, "CreateBucketConfiguration")
      .append_child("LocationConstraint")
      .text() = region.c_str();
  return Serialize(doc);
}

}  // namespace shardsafe
