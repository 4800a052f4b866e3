// placeholder until the data layer lands
namespace moetrain {}
